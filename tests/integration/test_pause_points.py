"""The built-in trainer at a sweep's pause points, on local gloo processes (gpt-tiny,
dp=2): it goes on past a `pause_at` step whose bar its validation loss beats, without
stopping, and stops with a checkpoint at one whose bar it misses."""

from __future__ import annotations

from pathlib import Path

from bench.harness.engine import run_engine
from gangway.models import PauseBar
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec


def test_the_trainer_goes_on_past_a_bar_it_beats_and_stops_at_one_it_misses(
    tmp_path: Path,
) -> None:
    spec = TrainSpec(
        steps=6,
        batch_size=4,
        eval_every=2,
        eval_batches=1,
        pause_at=[2, 4],
        pause_unless=[
            PauseBar(step=2, metric="val_loss", better_than=100.0),  # any loss beats it
            PauseBar(step=4, metric="val_loss", better_than=0.001),  # none does
        ],
    )
    result = run_engine(
        ParallelPlan(dp=2), spec, tmp_path / "run", checkpoint_dir=tmp_path / "checkpoints"
    )
    assert result["step"] == 4
    went_on, paused = result["events"]
    assert went_on.startswith("went on past step 2 (pause_at): val_loss ")
    assert went_on.endswith(" < 100, the sweep's bar")
    assert paused == "paused at step 4 (pause_at): saved to be continued"
    assert result["metrics"]["checkpoint_step"] == 4  # saved where it stopped
