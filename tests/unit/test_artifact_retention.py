"""The retention sweep of jobs' outputs and checkpoint directories, on a fake clock and a
fake store: a job that ended longer ago than the age loses its folders, one that ended
recently or is still active keeps them, and each job is swept once."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest

from scheduler.store.artifact_retention import (
    DELETING,
    ArtifactRetention,
    ArtifactSweeper,
    remove_folder,
)
from scheduler.store.outputs import job_outputs_dir, rank_outputs_dir
from workers.checkpoint_layout import checkpoint_path, job_directory

START = datetime(2026, 12, 1, tzinfo=UTC)
AGE = timedelta(days=30)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


class Jobs:
    """`EndedJobs` from a dict of job id -> ended at (None: still active); counts asks."""

    def __init__(self, ended: dict[int, datetime | None]) -> None:
        self.ended = ended
        self.asked: list[tuple[datetime | None, datetime]] = []

    def ended_between(self, start: datetime | None, end: datetime) -> list[int]:
        self.asked.append((start, end))
        return sorted(
            job_id
            for job_id, at in self.ended.items()
            if at is not None and at < end and (start is None or at >= start)
        )


def folders(tmp_path: Path, job_id: int) -> tuple[Path, Path]:
    """A job's outputs (one file on rank 0) and a complete checkpoint."""
    outputs = rank_outputs_dir(tmp_path / "outputs", job_id, 0)
    outputs.mkdir(parents=True)
    (outputs / "model.pt").write_bytes(b"weights")
    saved = checkpoint_path(job_directory(tmp_path / "checkpoints", job_id), 10)
    saved.mkdir(parents=True)
    (saved / ".metadata").write_bytes(b"m")
    return outputs.parent, saved.parent


def sweeper(tmp_path: Path, jobs: Jobs, clock: Clock) -> ArtifactSweeper:
    retention = ArtifactRetention(
        folders=(
            partial(job_outputs_dir, tmp_path / "outputs"),
            partial(job_directory, tmp_path / "checkpoints"),
        ),
        age=AGE,
    )
    return ArtifactSweeper(jobs, retention, clock)


def test_an_ended_jobs_folders_go_after_the_age_and_active_or_recent_ones_stay(
    tmp_path: Path,
) -> None:
    clock = Clock()
    jobs = Jobs({1: START - AGE - timedelta(hours=1), 2: START - timedelta(days=1), 3: None})
    made = {job_id: folders(tmp_path, job_id) for job_id in (1, 2, 3)}
    sweep = sweeper(tmp_path, jobs, clock)
    swept = sweep.sweep()
    assert sorted(swept.removed) == sorted(made[1])
    assert not any(p.exists() for p in made[1])
    assert all(p.exists() for p in (*made[2], *made[3]))
    clock.now += AGE  # job 2 now ended 31 days ago; job 3 is still running
    assert sorted(sweep.sweep().removed) == sorted(made[2])
    clock.now += AGE * 10
    assert sweep.sweep().removed == []
    assert all(p.exists() for p in made[3])
    leftovers = [p.name for p in (tmp_path / "outputs").iterdir()]
    assert leftovers == ["job-3"]


def test_each_sweep_asks_only_for_jobs_that_crossed_the_age_since_the_last(
    tmp_path: Path,
) -> None:
    clock = Clock()
    jobs = Jobs({})
    sweep = sweeper(tmp_path, jobs, clock)
    sweep.sweep()
    clock.now += timedelta(minutes=10)
    sweep.sweep()
    assert jobs.asked == [
        (None, START - AGE),
        (START - AGE, START - AGE + timedelta(minutes=10)),
    ]


def test_a_folder_that_failed_to_go_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    jobs = Jobs({1: START - AGE * 2})
    outputs, checkpoints = folders(tmp_path, 1)
    sweep = sweeper(tmp_path, jobs, clock)
    real_rmtree = shutil.rmtree
    calls: list[Path] = []

    def flaky(path: Path) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise PermissionError("busy")
        real_rmtree(path)

    monkeypatch.setattr(shutil, "rmtree", flaky)
    first = sweep.sweep()
    assert first.failed == [outputs] and first.removed == [checkpoints]
    clock.now += timedelta(minutes=10)  # the job is no longer in the window: retried
    assert sweep.sweep().removed == [outputs]
    assert not outputs.exists() and not (outputs.parent / (DELETING + outputs.name)).exists()


def test_a_symlinked_job_folder_loses_the_link_only(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_bytes(b"keep")
    link = job_outputs_dir(tmp_path / "outputs", 5)
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert remove_folder(link) is True
    assert not link.is_symlink() and (target / "keep.txt").read_bytes() == b"keep"
    assert remove_folder(link) is False


def test_a_sweep_interrupted_half_way_is_finished_next_time(tmp_path: Path) -> None:
    outputs, _ = folders(tmp_path, 1)
    doomed = outputs.with_name(DELETING + outputs.name)
    outputs.rename(doomed)  # renamed out of the layout, not yet deleted
    assert remove_folder(outputs) is True
    assert not doomed.exists()
    assert remove_folder(outputs) is False


def test_the_age_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ArtifactRetention(folders=(), age=timedelta(0))
