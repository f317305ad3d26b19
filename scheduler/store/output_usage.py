"""How many bytes a user's files hold, against the per-user storage quota
(`GANGWAY_STORAGE_QUOTA_BYTES`): their jobs' outputs and the versions of the models
they own, one quota for both, as both live in the same storage.

The runtime asks at launch (`storage_usage(...).remaining_bytes`) to cap what the new job's ranks
may collect, the registry before it copies a checkpoint into a new version; `GET
/v1/jobs/{id}/outputs` shows the owner's usage. The models' share is a sum over their
versions' rows (each file's size recorded at registration); the outputs' would walk every
file of every job the user has: about 0.7 s per 100,000 files on local disk here, far
more on network storage. So `UsageCache` keeps each job's total with a stamp of its
folder (the job folder's and each rank folder's inode and mtime, one stat each) and:

- a settled job (ended more than `settle` ago: its supervisors' last copies are done)
  is walked again only when its stamp changes (a rank folder came or went, or the
  retention sweep deleted it), so a user's history costs one stat per job and rank;
- an active job, which may write a file deep inside its folder without moving the
  stamp, is walked again once its total is older than `max_age_s` (30 s): usage lags
  its writes by at most that.

A job without a folder costs one failed stat. Standard library only, like
`scheduler.store.outputs`; the jobs come from any `OwnedJobs` (the repository).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol, TypeVar

from scheduler.store.outputs import RANK_PREFIX, job_bytes, job_outputs_dir

DEFAULT_QUOTA_BYTES = 100 * 2**30
SETTLE = timedelta(minutes=10)

# A folder's (inode, mtime) and its rank folders' (name, inode, mtime).
Stamp = tuple[tuple[int, int], tuple[tuple[str, int, int], ...]]


class OwnedJobs(Protocol):
    def user_job_ends(self, user: str) -> dict[int, datetime | None]:
        """Each of the user's jobs -> when it ended (None: not yet)."""
        ...


class JobOutputBytes(Protocol):
    def job_bytes(self, job_id: int, *, settled: bool, wait: bool = True) -> int:
        """Bytes the job's outputs hold (`settled`: they can no longer change; without
        `wait`, what is known now, when knowing more means waiting on a network)."""
        ...


class OwnedModels(Protocol):
    def owner_bytes(self, owner: str) -> int:
        """What the versions of `owner`'s models hold (the registry)."""
        ...


@dataclass(frozen=True)
class QuotaUse:
    user: str
    outputs_bytes: int
    model_bytes: int
    quota_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.outputs_bytes + self.model_bytes

    @property
    def remaining_bytes(self) -> int:
        return max(0, self.quota_bytes - self.used_bytes)


def stamp(root: Path, job_id: int) -> Stamp | None:
    """What changes when a rank folder comes or goes or the job folder is replaced;
    None when the job has no folder."""
    directory = job_outputs_dir(root, job_id)
    try:
        own = directory.lstat()
        with os.scandir(directory) as entries:
            ranks = []
            for entry in entries:
                if entry.name.startswith(RANK_PREFIX):
                    st = entry.stat(follow_symlinks=False)
                    ranks.append((entry.name, st.st_ino, st.st_mtime_ns))
    except OSError:
        return None
    return (own.st_ino, own.st_mtime_ns), tuple(sorted(ranks))


K = TypeVar("K")
V = TypeVar("V")


def keep_recent(entries: OrderedDict[K, V], key: K, value: V, max_entries: int) -> None:
    """Store `value` as the most recently used entry; the least recently used go past
    `max_entries` (the usage caches' bound on memory)."""
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > max_entries:
        entries.popitem(last=False)


class UsageCache:
    """Job id -> (stamp, bytes, when walked, settled then); least recently used first
    out past `max_jobs`. Thread-safe: the API's threads and the loop share one."""

    def __init__(
        self,
        *,
        max_age_s: float = 30.0,
        max_jobs: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_age_s, self._max_jobs, self._clock = max_age_s, max_jobs, clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Path, int], tuple[Stamp, int, float, bool]] = OrderedDict()

    def job_bytes(self, root: Path, job_id: int, *, settled: bool) -> int:
        current = stamp(root, job_id)
        key = (root, job_id)
        if current is None:
            with self._lock:
                self._entries.pop(key, None)
            return 0
        now = self._clock()
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and self._still_valid(cached, current, now):
                self._entries.move_to_end(key)
                return cached[1]
        total = job_bytes(root, job_id)
        with self._lock:
            keep_recent(self._entries, key, (current, total, now, settled), self._max_jobs)
        return total

    def _still_valid(
        self, cached: tuple[Stamp, int, float, bool], current: Stamp, now: float
    ) -> bool:
        was, _, walked_at, settled = cached
        return was == current and (settled or now - walked_at < self._max_age_s)


USAGE = UsageCache()  # one per process: the API and the loop share it


def is_settled(ended_at: datetime | None, now: datetime, settle: timedelta = SETTLE) -> bool:
    """Whether a job's outputs can no longer change: it ended `settle` ago or more, time
    for its ranks' supervisors to have made their last copies."""
    return ended_at is not None and now - ended_at >= settle


def storage_usage(
    jobs: OwnedJobs,
    models: OwnedModels,
    outputs: JobOutputBytes | None,
    user: str,
    *,
    quota_bytes: int,
    now: datetime,
    settle: timedelta = SETTLE,
    wait: bool = True,
) -> QuotaUse:
    """The user's outputs (over every job of theirs; none without an outputs store) and
    model versions, against their quota. A settled job's total is trusted from the
    store's cache (see the module docstring for the cost)."""
    used = 0
    if outputs is not None:
        ends = jobs.user_job_ends(user)
        used = sum(
            outputs.job_bytes(j, settled=is_settled(ended, now, settle), wait=wait)
            for j, ended in ends.items()
        )
    return QuotaUse(user, used, models.owner_bytes(user), quota_bytes)
