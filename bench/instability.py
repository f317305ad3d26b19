"""A NaN in the middle of a run, and on every step: what `on_instability: rollback` does.

Trains gpt-tiny at dp=2 on local gloo processes (`bench.harness.engine`) for `--steps`
with a checkpoint every `--interval` steps, three times: clean; with the loss made NaN on
every rank at step `--at` (`GANGWAY_FAULTS` `engine.loss:nan@N`); and with a NaN on every
step. Prints the rollback events, the final training and validation losses of the first
two, and why the third failed.

    .venv/bin/python -m bench.instability --steps 200 --at 100 --interval 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.harness.engine import run_engine
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec

PLAN = ParallelPlan(dp=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--at", type=int, default=100)
    parser.add_argument("--interval", type=int, default=20)
    args = parser.parse_args()
    spec = TrainSpec(steps=args.steps, batch_size=4, checkpoint_interval_steps=args.interval)
    root = Path(tempfile.mkdtemp(prefix="gangway-instability-"))
    clean = run_engine(PLAN, spec, root / "clean", checkpoint_dir=root / "clean-ck")
    nan_at = {rank: f"engine.loss:nan@{args.at}" for rank in range(PLAN.world_size)}
    hit = run_engine(PLAN, spec, root / "hit", checkpoint_dir=root / "hit-ck", rank_faults=nan_at)
    print("events:", hit["events"])
    for name, key in (("final training loss", None), ("final val_loss", "val_loss")):
        a = clean["losses"][-1] if key is None else clean["metrics"][key]
        b = hit["losses"][-1] if key is None else hit["metrics"][key]
        print(f"{name}: clean {a:.4f}, with the NaN {b:.4f} ({(b / a - 1) * 100:+.2f}%)")
    every = {rank: "engine.loss:nan" for rank in range(PLAN.world_size)}
    try:
        run_engine(PLAN, spec, root / "every", checkpoint_dir=root / "every-ck", rank_faults=every)
        print("NaN on every step: the run ended (it should have failed)")
    except Exception as exc:  # the failed rank's traceback, as the job's reason would say
        print("NaN on every step:", str(exc).strip().splitlines()[-1])


if __name__ == "__main__":
    main()
