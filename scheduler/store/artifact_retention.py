"""Retention of jobs' files: the outputs and the checkpoint directory of a job that ended
more than `GANGWAY_ARTIFACT_RETENTION_DAYS` ago are deleted. A job still active is never
touched, and nothing is recorded in the database: the job's row and events stay (they
are the record of what ran), and a listing of a deleted folder is simply empty.

`ArtifactSweeper.sweep` asks the store for the jobs that crossed the age since its
previous sweep (all that ended before it, on the first sweep after a start), so a sweep's
cost follows the jobs that ended in one interval, not the history; a folder it failed to
delete is tried again next time. A folder is first renamed out of the layout
(`.deleting-job-<id>`), so a reader sees it whole or gone, then deleted; a leftover from
an interrupted sweep is finished the next time its job comes up, or by `sweep` of the
same root after a restart (the first sweep sees every ended job again).

Pure apart from the file system: the jobs come from any `EndedJobs` (the repository) and
the time from `clock`, so a test drives it with a fake clock.
"""

from __future__ import annotations

import logging
import shutil
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

log = logging.getLogger("gangway")

DEFAULT_AGE = timedelta(days=30)
DELETING = ".deleting-"


class StoredFiles(Protocol):
    """A job's files in a store named by a URL (`JobCheckpointStore`)."""

    url: str

    def delete(self) -> bool:
        """Delete them all; whether there was anything."""
        ...


class EndedJobs(Protocol):
    def ended_between(self, start: datetime | None, end: datetime) -> list[int]:
        """Jobs that ended (terminal) at or after `start` (None: ever), before `end`."""
        ...


@dataclass(frozen=True)
class ArtifactRetention:
    """How long an ended job's files are kept, and where they are: each function maps a
    job id to one of its folders (`job_outputs_dir`, the checkpoint `job_directory`) or
    to its part of a store (checkpoints in a bucket)."""

    folders: Sequence[Callable[[int], Path]]
    age: timedelta = DEFAULT_AGE
    stores: Sequence[Callable[[int], StoredFiles]] = ()

    def __post_init__(self) -> None:
        if self.age <= timedelta(0):
            raise ValueError("the retention age must be positive")


@dataclass
class SweptFolders:
    removed: list[Path | str] = field(default_factory=list)  # a folder, or a store's URL
    failed: list[Path | str] = field(default_factory=list)


class ArtifactSweeper:
    def __init__(
        self, jobs: EndedJobs, retention: ArtifactRetention, clock: Callable[[], datetime]
    ) -> None:
        self._jobs, self._retention, self._clock = jobs, retention, clock
        self._last_cutoff: datetime | None = None
        self._retry: set[int] = set()

    def sweep(self) -> SweptFolders:
        """Delete the folders of jobs that ended before now - age and were not swept yet."""
        cutoff = self._clock() - self._retention.age
        due = set(self._jobs.ended_between(self._last_cutoff, cutoff)) | self._retry
        swept, retry = SweptFolders(), set()
        for job_id in sorted(due):
            for folder in self._retention.folders:
                path = folder(job_id)
                try:
                    if remove_folder(path):
                        swept.removed.append(path)
                except OSError:
                    log.exception("retention: could not delete %s; trying again next sweep", path)
                    swept.failed.append(path)
                    retry.add(job_id)
            for store in self._retention.stores:
                files = store(job_id)
                try:
                    if files.delete():
                        swept.removed.append(files.url)
                except Exception:  # the store or the network: tried again next sweep
                    log.exception("retention: could not delete %s; trying again", files.url)
                    swept.failed.append(files.url)
                    retry.add(job_id)
        self._last_cutoff, self._retry = cutoff, retry
        return swept


def remove_folder(path: Path) -> bool:
    """Delete `path` (a folder, or a stray symlink: the link only, never its target);
    False when there was nothing. Renamed first, so it leaves the layout at once."""
    doomed = path.with_name(DELETING + path.name)
    found = False
    if _exists(doomed):  # an earlier sweep stopped half-way
        _delete(doomed)
        found = True
    if _exists(path):
        path.rename(doomed)
        _delete(doomed)
        found = True
    return found


def _exists(path: Path) -> bool:
    try:
        path.lstat()
    except FileNotFoundError:
        return False
    return True


def _delete(path: Path) -> None:
    if stat.S_ISDIR(path.lstat().st_mode):
        shutil.rmtree(path)  # does not follow symlinks inside
    else:
        path.unlink()


class Sweeper(Protocol):
    def sweep(self) -> SweptFolders: ...


def sweep_artifacts(sweepers: Sequence[Sweeper], stop: threading.Event, interval_s: float) -> None:
    """Run each sweeper every `interval_s` until `stop` (the body of `serve`'s retention
    thread: jobs' folders, model versions); a failed sweep is logged and tried again next
    time (it only deletes)."""
    while not stop.wait(interval_s):
        for sweeper in sweepers:
            try:
                swept = sweeper.sweep()
            except Exception:
                log.exception("retention sweep failed (%s)", type(sweeper).__name__)
                continue
            if swept.removed:
                log.info("retention: deleted %d folders", len(swept.removed))
