"""Load balancing: pipeline stages by measured cost, and batch shares by rank speed.

    .venv/bin/python bench/engine_balance.py stages --model gpt-mini --pp 2 4 6 8
    .venv/bin/python bench/engine_balance.py stages --model gpt-mini --pp 2 4 --schedule zbv
    .venv/bin/python bench/engine_balance.py stages --model gpt-small --pp 4 8 --batch 1 \
        --repeats 1 --predict-only
    .venv/bin/python bench/engine_balance.py mlp --model gpt-mini
    .venv/bin/python bench/engine_balance.py batch --model gpt-tiny --steps 30 --batch 200
    .venv/bin/python bench/engine_balance.py pipeline --model gpt-mini --pp 2

`stages`: each item's forward + backward is measured (`workers.engine.item_costs.measure_costs`:
embeddings, each block's five pieces, the head's four vocabulary slices); then every
stage of the equal split, of the balanced split at whole blocks and a whole head (as
under tensor parallel), of the one that may cut blocks but keeps the head whole (as
under FSDP in bf16) and of the one that may cut both is built as the pipeline builds it
(`GPT.keep_only`; a split head's stages take the target ids too) and timed on
its own, forward + backward on one microbatch, the fastest of `--repeats`, in CPU time (one
thread; the machine's other load does not count), the runs going round every stage of
every split in turn. Prints slowest/fastest pipeline rank time for each split, timed and
as the item costs predict it: a rank's time is its stage's, or under `--schedule zbv`
the sum of its two (stages r and 2 pp - 1 - r). `--predict-only` skips building and
timing the stages (a model too big to time every split of on a CPU).

`mlp`: what the MLP's four slices of its hidden width (there so a stage may end inside
an MLP) cost a whole model against one fc and one proj: slices/whole, forward + backward.

`batch`: 2 gloo ranks, rank 1's compute made `--slow` x slower; equal shares against
`balance_batch` on the same samples, and the same gang with no straggler, alternated
`--repeats` times. Prints the median step time after the first rebalance, the change
against equal shares, the share of the straggler's cost rebalancing takes back, and the
largest loss difference per step. On 2 shared cores a sleeping straggler frees CPU for
its peer, so equal shares lose less than the slowdown says; the no-straggler run shows
what is left to take back.

`pipeline`: the same pp job end to end under each schedule named, stages balanced by
measured cost; prints the median step time (a check that a schedule costs nothing extra).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast, get_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

import torch

from bench.engine_modes import run
from bench.harness.older_models import WholeMLP
from gangway.models import PipelineSchedule
from workers.engine import balance, item_costs
from workers.engine.gpt import GPT, Block, next_token_loss, splits_head
from workers.engine.model_configs import MODEL_CONFIGS, GPTConfig
from workers.engine.plan import ParallelPlan
from workers.engine.rank_speed import REBALANCE_EVERY
from workers.engine.stage_plan import equal_units
from workers.engine.training import TrainSpec


def stage_times(
    config: GPTConfig, splits: list[list[range]], batch: int, repeats: int
) -> list[list[float]]:
    """Each stage of each split, built and timed alone (forward + backward, one
    microbatch); the runs go round every stage of every split in turn, so the machine's
    drift falls on all alike (timed one split after another, the same split read 1.11
    and 1.26 two minutes apart)."""
    tokens = torch.randint(config.vocab_size, (batch, config.seq_len))
    stages = []
    for units in splits:
        carries = splits_head(config, units)
        for stage, pieces in enumerate(units):
            torch.manual_seed(0)
            model = GPT(config)
            first, last = stage == 0, stage == len(units) - 1
            model.keep_only(pieces, first=first)
            hidden = item_costs.unit_input(config, batch, pieces.start, torch.device("cpu"))
            stages.append((model, tokens if first else hidden, first, last, carries))
    runs: list[list[float]] = [[] for _ in stages]
    for _ in range(repeats):
        for k, (model, inputs, first, last, carries) in enumerate(stages):
            x = inputs if first else inputs.clone().requires_grad_(True)
            began = time.process_time()
            out = model(x, tokens) if carries else model(x)
            out = out[0] if isinstance(out, tuple) else out
            loss = next_token_loss(out, tokens) if last else out.square().mean()
            loss.backward()  # type: ignore[no-untyped-call]
            runs[k].append(time.process_time() - began)
    fastest = iter([min(r) for r in runs])
    return [[next(fastest) for _ in units] for units in splits]


def bench_stages(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    config = MODEL_CONFIGS[args.model]
    costs = item_costs.measure_costs(
        config, batch=args.batch, in_flight=1, device=torch.device("cpu"), repeats=args.repeats
    )
    print("item costs (ms): " + ", ".join(f"{c.time_s * 1000:.1f}" for c in costs), flush=True)
    for pp in args.pp:
        ranks = ParallelPlan(pp=pp, pipeline_schedule=args.schedule).ranks_stages()
        splits = {
            "equal": equal_units(config, ranks),
            "whole_blocks": balance.balanced_split(
                costs, ranks, config, cut_blocks=False, cut_head=False
            ).units,
            "whole_head": balance.balanced_split(costs, ranks, config, cut_head=False).units,
            "balanced": balance.balanced_split(costs, ranks, config).units,
        }
        row: dict[str, Any] = {"model": args.model, "schedule": args.schedule, "pp": pp}
        for name, units in splits.items():
            predicted = balance.stage_costs(costs, units, ranks)
            row[name] = {
                "stages": [
                    balance.stage_items(config, r, first=s == 0) for s, r in enumerate(units)
                ],
                "predicted": round(predicted.time_ratio, 3),
                "predicted_slowest_ms": round(max(predicted.rank_time_s) * 1000, 1),
            }
        if not args.predict_only:
            timed = stage_times(config, list(splits.values()), args.batch, args.repeats)
            for name, times in zip(splits, timed, strict=True):
                per_rank = [sum(times[s] for s in stages) for stages in ranks]
                row[name] |= {
                    "stage_ms": [round(t * 1000, 1) for t in times],
                    "rank_stages": ranks,
                    "rank_ms": [round(t * 1000, 1) for t in per_rank],
                    "slowest_over_fastest": round(max(per_rank) / min(per_rank), 3),
                }
        print(json.dumps(row), flush=True)


def bench_mlp(args: argparse.Namespace) -> None:
    """What the MLP's slices (there for the stage split) cost a whole model: forward +
    backward of the model with its MLPs in slices and of the same weights as one fc and
    one proj (`bench.harness.older_models.WholeMLP`), alternated, the fastest of `--repeats`
    each, in CPU time on one thread."""
    torch.set_num_threads(1)
    config = MODEL_CONFIGS[args.model]
    torch.manual_seed(0)
    sliced = GPT(config)
    whole = copy.deepcopy(sliced)
    for block in whole.blocks.values():
        block.mlp = WholeMLP(cast(Block, block).mlp)
    tokens = torch.randint(config.vocab_size, (args.batch, config.seq_len))
    runs: dict[str, list[float]] = {"sliced": [], "whole": []}
    for _ in range(args.repeats):
        for name, model in (("sliced", sliced), ("whole", whole)):
            began = time.process_time()
            next_token_loss(model(tokens), tokens).backward()  # type: ignore[no-untyped-call]
            runs[name].append(time.process_time() - began)
    sliced_s, whole_s = min(runs["sliced"]), min(runs["whole"])
    print(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "sliced_ms": round(sliced_s * 1000, 1),
                "whole_ms": round(whole_s * 1000, 1),
                "sliced_over_whole": round(sliced_s / whole_s, 3),
            }
        ),
        flush=True,
    )


def bench_batch(args: argparse.Namespace) -> None:
    """Equal shares, rebalanced shares and no straggler at all, alternated `--repeats`
    times (the machine's load drifts): the medians, the change against equal shares, and
    how much of the straggler's cost rebalancing takes back."""
    spec = TrainSpec(
        model=args.model,
        steps=args.steps,
        batch_size=args.batch,
        max_grad_norm=None,
        log_every=1000,
    )
    slow = {1: args.slow}
    runs: dict[str, list[float]] = {"equal": [], "balanced": [], "no_straggler": []}
    diffs, shares = [], []
    after = slice(REBALANCE_EVERY + 1, None)  # from the step after the first rebalance
    for repeat in range(args.repeats):
        equal = run(ParallelPlan(dp=2), spec, slow)
        balanced = run(ParallelPlan(dp=2, balance_batch=True), spec, slow)
        alone = run(ParallelPlan(dp=2), spec, {})
        for name, steps in (("equal", equal), ("balanced", balanced), ("no_straggler", alone)):
            runs[name].append(statistics.median(s["step_time_s"] for s in steps[after]))
        diffs.append(max(abs(a["loss"] - b["loss"]) for a, b in zip(equal, balanced, strict=True)))
        shares.append(balanced[-1]["batch_share"])
        print(json.dumps({"repeat": repeat} | {k: round(v[-1], 4) for k, v in runs.items()}))
    equal_s, balanced_s, alone_s = (statistics.median(runs[k]) for k in runs)
    result = {
        "model": args.model,
        "slowdown": args.slow,
        "global_batch": 2 * args.batch,
        "repeats": args.repeats,
        "shares_rank0": shares,
        "equal_step_s": round(equal_s, 4),
        "balanced_step_s": round(balanced_s, 4),
        "no_straggler_step_s": round(alone_s, 4),
        "step_time_change": f"{balanced_s / equal_s - 1:+.1%}",
        "per_repeat_change": [
            f"{b / e - 1:+.1%}" for e, b in zip(runs["equal"], runs["balanced"], strict=True)
        ],
        # of what equal shares lose to the straggler (noise can make that 0 or less)
        "straggler_cost_taken_back": (
            f"{(equal_s - balanced_s) / (equal_s - alone_s):.0%}" if equal_s > alone_s else None
        ),
        "max_loss_diff": max(diffs),
    }
    print(json.dumps(result), flush=True)


def bench_pipeline(args: argparse.Namespace) -> None:
    """End to end: the same pp job under each schedule, stages balanced by measured cost;
    the median step time after the first steps (one process per stage's rank)."""
    spec = TrainSpec(model=args.model, steps=args.steps, batch_size=args.batch, log_every=1000)
    for schedule in args.schedules:
        plan = ParallelPlan(
            pp=args.pp,
            microbatches=args.microbatches,
            pipeline_schedule=schedule,
            balance_stages=True,
        )
        steps = run(plan, spec, {})
        step_s = statistics.median(s["step_time_s"] for s in steps[2:])
        print(json.dumps({"schedule": schedule, "pp": args.pp, "step_s": round(step_s, 3)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    stages = sub.add_parser("stages")
    stages.add_argument("--model", default="gpt-mini")
    stages.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    stages.add_argument("--batch", type=int, default=2, help="microbatch size")
    stages.add_argument(
        "--schedule",
        choices=get_args(PipelineSchedule),
        default="1f1b",
        help="interleaved-1f1b, zbv: two stages per rank; a rank's time is their sum",
    )
    stages.add_argument("--repeats", type=int, default=5)
    stages.add_argument(
        "--predict-only", action="store_true", help="print the splits' predicted ratios only"
    )
    mlp = sub.add_parser("mlp")
    mlp.add_argument("--model", default="gpt-mini")
    mlp.add_argument("--batch", type=int, default=2)
    mlp.add_argument("--repeats", type=int, default=20)
    batch = sub.add_parser("batch")
    batch.add_argument("--model", default="gpt-tiny")
    batch.add_argument("--steps", type=int, default=40)
    batch.add_argument("--batch", type=int, default=20, help="per rank (equal shares)")
    batch.add_argument("--slow", type=float, default=1.5)
    batch.add_argument("--repeats", type=int, default=3)
    pipeline = sub.add_parser("pipeline")
    pipeline.add_argument("--model", default="gpt-mini")
    pipeline.add_argument("--pp", type=int, default=2)
    pipeline.add_argument("--steps", type=int, default=6)
    pipeline.add_argument("--batch", type=int, default=8)
    pipeline.add_argument("--microbatches", type=int, default=4)
    pipeline.add_argument("--schedules", nargs="+", default=["1f1b", "zbv", "1f1b", "zbv"])
    args = parser.parse_args()
    commands = {
        "stages": bench_stages,
        "mlp": bench_mlp,
        "batch": bench_batch,
        "pipeline": bench_pipeline,
    }
    commands[args.what](args)


if __name__ == "__main__":
    main()
