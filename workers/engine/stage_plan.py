"""Which block pieces each pipeline stage of a built-in job holds: an equal count of
whole blocks, or the split `workers.engine.balance` computes from measured costs, said in the
job's log and events."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workers.engine import balance, item_costs
from workers.engine.checkpoint import is_rank0
from workers.engine.gpt import block_units
from workers.engine.model_configs import GPTConfig
from workers.engine.plan import ParallelPlan

if TYPE_CHECKING:
    from workers.engine.training import Reporter, TrainSpec


def stage_units(
    plan: ParallelPlan, spec: TrainSpec, device: torch.device, reporter: Reporter
) -> list[range]:
    """Each pipeline stage's units (block pieces, head slices): an equal count of whole
    blocks and the head on the last stage, or split by measured cost (said in the job's
    log and its events). Under tensor parallel whole blocks and the whole head, as its
    sharding plan is per block; under FSDP in bf16 the head whole, as FSDP casts a
    stage's inputs to bf16 and the running log-sum-exp between head slices needs fp32."""
    ranks = plan.ranks_stages()
    equal = equal_units(spec.config, ranks)
    if not plan.balance_stages:
        return equal
    micro = spec.batch_size // plan.microbatches
    shards = plan.dp if plan.fsdp else 1
    measured = item_costs.measure_costs(
        spec.config, batch=micro, in_flight=plan.microbatches, device=device, param_shards=shards
    )
    costs = item_costs.averaged(measured)
    budget = _memory_budget(plan, device)
    note = ""
    cut_head = plan.tp == 1 and (plan.precision == "fp32" or not plan.fsdp)
    cuts = {"cut_blocks": plan.tp == 1, "cut_head": cut_head}
    try:
        chosen = balance.balanced_split(costs, ranks, spec.config, memory_budget=budget, **cuts)
    except ValueError:  # the estimate is rough (no activations inside a stage): go by time
        chosen = balance.balanced_split(costs, ranks, spec.config, **cuts)
        note = f" (no split keeps the memory estimate under {budget or 0:.3g} B: by time only)"
    if is_rank0():
        before = balance.stage_costs(costs, equal, ranks)
        line = split_line(spec.config, chosen, before) + note
        print(line, flush=True)
        reporter.event(line)
    return chosen.units


def equal_units(config: GPTConfig, ranks: list[list[int]]) -> list[range]:
    """An equal count of whole blocks per stage (`balance.equal_layers`), the head last."""
    layers = balance.equal_layers(config.n_layer, ranks)
    last = len(layers) - 1
    return [block_units(config, r, last=s == last) for s, r in enumerate(layers)]


def _memory_budget(plan: ParallelPlan, device: torch.device) -> float | None:
    """What the split may plan per stage (ZB-V: per rank pair): 90% of a GPU's memory,
    shared by the stages a rank runs under interleaved 1F1B; none on a CPU."""
    if device.type != "cuda":
        return None
    share = 1 if plan.v_shape else plan.stages_per_rank
    return 0.9 * torch.cuda.get_device_properties(device).total_memory / share


def split_line(config: GPTConfig, chosen: balance.StageSplit, equal: balance.StageSplit) -> str:
    """The job's log keeps how the stages were split and why."""
    stages = "; ".join(
        f"{s}: {balance.stage_items(config, r, first=s == 0)}, {t * 1000:.1f} ms, "
        f"{m / 2**20:.0f} MiB"
        for s, (r, t, m) in enumerate(
            zip(chosen.units, chosen.time_s, chosen.memory_bytes, strict=True)
        )
    )
    ranks = ""
    if any(len(pair) > 1 for pair in chosen.ranks):  # ZB-V: what each rank runs
        ranks = "; ranks: " + ", ".join(
            f"{'+'.join(map(str, pair))} {t * 1000:.1f} ms"
            for pair, t in zip(chosen.ranks, chosen.rank_time_s, strict=True)
        )
    return (
        f"pipeline stages by measured cost: {stages}{ranks}; slowest/fastest "
        f"{chosen.time_ratio:.2f} (equal layer counts: {equal.time_ratio:.2f})"
    )
