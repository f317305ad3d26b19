"""A user's storage (outputs and model versions) against their quota; of the outputs,
each job's bytes walked once and kept while its folder's stamp holds (for good once the
job settled; `max_age_s` while it may still write deep inside), with a fake clock."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scheduler.store.output_stores import LocalOutputs
from scheduler.store.output_usage import (
    SETTLE,
    UsageCache,
    storage_usage,
)
from scheduler.store.outputs import rank_outputs_dir

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Jobs:
    """`OwnedJobs` from a dict: user -> {job id: ended at}."""

    def __init__(self, owned: dict[str, dict[int, datetime | None]]) -> None:
        self.owned = owned

    def user_job_ends(self, user: str) -> dict[int, datetime | None]:
        return dict(self.owned.get(user, {}))


class Models:
    """`OwnedModels` from a dict: owner -> bytes of their versions."""

    def __init__(self, held: dict[str, int]) -> None:
        self.held = held

    def owner_bytes(self, owner: str) -> int:
        return self.held.get(owner, 0)


def put(root: Path, job_id: int, rank: int, path: str, size: int) -> None:
    target = rank_outputs_dir(root, job_id, rank) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"x" * size)


def test_an_active_jobs_total_is_walked_again_once_it_is_older_than_max_age(
    tmp_path: Path,
) -> None:
    clock = Clock()
    cache = UsageCache(max_age_s=30.0, clock=clock)
    put(tmp_path, 1, 0, "deep/a", 100)
    assert cache.job_bytes(tmp_path, 1, settled=False) == 100
    put(tmp_path, 1, 0, "deep/b", 50)  # deep inside: the folders' stamp does not move
    assert cache.job_bytes(tmp_path, 1, settled=False) == 100
    clock.now += 31
    assert cache.job_bytes(tmp_path, 1, settled=False) == 150


def test_a_settled_jobs_total_is_kept_until_a_rank_folder_comes_or_goes(tmp_path: Path) -> None:
    clock = Clock()
    cache = UsageCache(max_age_s=30.0, clock=clock)
    put(tmp_path, 1, 0, "deep/a", 100)
    assert cache.job_bytes(tmp_path, 1, settled=True) == 100
    put(tmp_path, 1, 0, "deep/b", 50)
    clock.now += 10_000
    assert cache.job_bytes(tmp_path, 1, settled=True) == 100  # no walk: stamp unchanged
    put(tmp_path, 1, 3, "late", 7)  # a new rank folder moves the stamp
    assert cache.job_bytes(tmp_path, 1, settled=True) == 157
    shutil.rmtree(tmp_path / "job-1")  # the retention sweep
    assert cache.job_bytes(tmp_path, 1, settled=True) == 0


def test_usage_sums_the_users_jobs_and_remaining_never_goes_below_zero(tmp_path: Path) -> None:
    put(tmp_path, 1, 0, "a", 600)
    put(tmp_path, 1, 1, "a", 400)  # a second rank's copy takes storage too
    put(tmp_path, 2, 0, "b", 300)
    put(tmp_path, 3, 0, "c", 5000)  # bob's
    jobs = Jobs({"alice": {1: NOW - SETTLE * 2, 2: None, 4: None}, "bob": {3: None}})
    cache = UsageCache()
    outputs = LocalOutputs(tmp_path, cache)
    assert sum(outputs.job_bytes(j, settled=False) for j in (1, 2, 4)) == 1300
    models = Models({"alice": 200})  # her model versions share the quota
    usage = storage_usage(jobs, models, outputs, "alice", quota_bytes=2000, now=NOW)
    assert (usage.outputs_bytes, usage.model_bytes, usage.remaining_bytes) == (1300, 200, 500)

    def left(user: str) -> int:
        return storage_usage(
            jobs, models, LocalOutputs(tmp_path), user, quota_bytes=2000, now=NOW
        ).remaining_bytes

    assert (left("alice"), left("bob"), left("carol")) == (500, 0, 2000)
    no_outputs = storage_usage(jobs, models, None, "alice", quota_bytes=2000, now=NOW)
    assert no_outputs.used_bytes == 200


def test_the_cache_forgets_the_least_recently_used_jobs_past_its_size(tmp_path: Path) -> None:
    clock = Clock()
    cache = UsageCache(max_jobs=2, clock=clock)
    for job_id in (1, 2, 3):
        put(tmp_path, job_id, 0, "f", job_id)
        cache.job_bytes(tmp_path, job_id, settled=True)
    put(tmp_path, 1, 0, "deep/g", 10)  # not seen by a cached total, seen by a walk
    assert cache.job_bytes(tmp_path, 3, settled=True) == 3
    assert cache.job_bytes(tmp_path, 1, settled=True) == 11  # forgotten, walked again


def test_settled_means_ended_at_least_the_settle_time_ago(tmp_path: Path) -> None:
    put(tmp_path, 1, 0, "a", 10)
    jobs = Jobs({"alice": {1: NOW - timedelta(seconds=5)}})
    clock = Clock()
    cache = UsageCache(max_age_s=30.0, clock=clock)
    assert usage(jobs, tmp_path, NOW, cache) == 10
    put(tmp_path, 1, 0, "deep/b", 5)  # its supervisors' last copies, just after the end
    clock.now += 31
    later = NOW + SETTLE
    assert usage(jobs, tmp_path, later, cache) == 15


def usage(jobs: Jobs, root: Path, now: datetime, cache: UsageCache) -> int:
    return storage_usage(
        jobs, Models({}), LocalOutputs(root, cache), "alice", quota_bytes=1, now=now
    ).used_bytes
