"""The built-in trainer's bad steps on local gloo processes (gpt-tiny, dp=2): a NaN loss
injected at a step (`engine.loss:nan`, `workers.faults`) is rolled back, skipped or
fails the job, as `on_instability` says."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from torch.multiprocessing import ProcessRaisedException

from bench.harness.engine import run_engine
from workers.engine.health import InstabilityPolicy
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec

STEPS = 8
PLAN = ParallelPlan(dp=2)


def spec(action: str = "rollback", *, steps: int = STEPS) -> TrainSpec:
    policy = InstabilityPolicy(action=action)  # type: ignore[arg-type]
    return TrainSpec(steps=steps, batch_size=4, checkpoint_interval_steps=2, on_instability=policy)


def nan_on_every_rank(text: str) -> dict[int, str]:
    return dict.fromkeys(range(PLAN.world_size), text)


@cache
def clean_run(out: Path) -> dict[str, Any]:
    return run_engine(PLAN, spec(), out / "clean", checkpoint_dir=out / "clean-checkpoints")


def test_a_nan_step_is_rolled_back_once_and_the_run_ends_on_course(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    faulted = run_engine(
        PLAN,
        spec(),
        tmp_path / "run",
        checkpoint_dir=tmp_path / "checkpoints",
        rank_faults=nan_on_every_rank("engine.loss:nan@5"),
    )
    assert faulted["events"] == [
        "instability at step 5: loss is nan (grad norm nan); rolled back to step 4, "
        "skipping samples 32-39, lr x1 (rollback 1 of 3)"
    ]
    assert (faulted["step"], len(faulted["losses"])) == (STEPS, STEPS)
    assert faulted["metrics"]["rollbacks"] == 1
    clean = clean_run(tmp_path_factory.getbasetemp())
    assert faulted["losses"][:4] == clean["losses"][:4]
    assert faulted["losses"][-1] == pytest.approx(clean["losses"][-1], rel=0.02)


def test_nan_on_every_step_fails_once_max_rollbacks_did_not_help(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    run_engine(PLAN, spec(steps=3), tmp_path / "first", checkpoint_dir=checkpoints)
    with pytest.raises(ProcessRaisedException, match=r"step 4: loss is nan .*3 rollbacks did"):
        run_engine(
            PLAN,
            spec(),
            tmp_path / "second",
            checkpoint_dir=checkpoints,
            rank_faults=nan_on_every_rank("engine.loss:nan"),
        )


def test_fail_ends_the_run_at_the_bad_step_whichever_rank_had_it(tmp_path: Path) -> None:
    """Under local SGD the ranks' gradients are their own: rank 1's NaN still reaches
    rank 0 through the global loss, and both stop at the same step."""
    plan = ParallelPlan(dp=2, update_mode="local-sgd", sync_period=4)
    with pytest.raises(ProcessRaisedException, match=r"step 3: loss is nan .*on_instability=fail"):
        run_engine(plan, spec("fail"), tmp_path, rank_faults={1: "engine.loss:nan@3"})


def test_skip_drops_the_update_and_goes_on(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    skipped = run_engine(
        PLAN, spec("skip"), tmp_path, rank_faults=nan_on_every_rank("engine.loss:nan@3")
    )
    assert skipped["events"] == [
        "instability at step 3: loss is nan (grad norm nan); update skipped"
    ]
    losses = skipped["losses"]
    assert len(losses) == STEPS and math.isnan(losses[2])
    clean = clean_run(tmp_path_factory.getbasetemp())
    assert losses[:2] == clean["losses"][:2]
    assert all(math.isfinite(loss) for loss in losses[3:])
    assert losses[-1] < losses[0] - 0.2  # the NaN gradients were never applied
    assert skipped["metrics"]["skipped_steps"] == 1


def test_skip_gives_up_after_a_window_of_bad_steps_in_a_row(tmp_path: Path) -> None:
    """A run whose every update is dropped must not end as if it trained."""
    policy = InstabilityPolicy(action="skip", spike_window=5)
    spec = TrainSpec(steps=STEPS, batch_size=4, on_instability=policy)
    with pytest.raises(
        ProcessRaisedException, match=r"step 5: loss is nan .* 5 bad steps in a row"
    ):
        run_engine(PLAN, spec, tmp_path, rank_faults=nan_on_every_rank("engine.loss:nan"))
