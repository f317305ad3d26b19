"""Checkpoints in storage named by a URL (S3 or any other fsspec filesystem), for
clusters whose hosts share no disk. Torch-free: the service lists and deletes with it.

The rank program never holds the storage's credentials: it saves into a directory of its
own on its host, as `workers.engine.checkpoint` always does, and its supervisor (Gangway's
trusted code, which holds them) copies each finished `step-*` directory up and, before the
program starts, the newest complete checkpoint down. A job's code therefore cannot read or
overwrite another job's checkpoints, whatever the bucket's policy.

Layout: `<root>/job-<id>/attempt-<n>/step-00000120/` holds the union of the files every
rank of attempt n wrote for step 120, and `.ranks/<rank>-of-<world>` for each rank whose
supervisor finished uploading its own (written after them). A checkpoint is complete
when it holds `.metadata` (DCP's, from rank 0) and the marker of every rank of its world:
uploads of different ranks land in any order, a host lost mid-upload leaves its
checkpoint incomplete, and an incomplete one is never resumed from or listed. Each attempt
writes under its own name, so a supervisor of an attempt that was given up (a host cut
off, then healed) can finish an upload late without mixing its files into a newer
attempt's checkpoint at the same step.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from fsspec import AbstractFileSystem

from workers.checkpoint_layout import PREFIX, step_of
from workers.stored_files import StoredFolder, filesystem, get_files, modified, put_open_file

MARKERS = ".ranks"
_MARKER = re.compile(r"(\d+)-of-(\d+)")
_STEP = re.compile(rf"{PREFIX}\d{{8}}")  # as checkpoint_path writes it: one name per step
_ATTEMPT = re.compile(r"attempt-(\d+)")
MAX_FILES = 100_000  # in one rank's step directory


@dataclass(frozen=True)
class RankOf:
    """Which rank of which attempt uploads: its marker, and the attempt's directory."""

    attempt: int
    rank: int
    world_size: int


@dataclass(frozen=True)
class RemoteCheckpoint:
    url: str  # the step directory's URL
    step: int
    bytes: int
    saved_at: datetime  # when its last rank's upload finished
    files: tuple[str, ...]  # paths relative to the step directory, markers left out


class JobCheckpointStore:
    """One job's checkpoints under `url` (`<root>/job-<id>`)."""

    def __init__(self, url: str, fs: AbstractFileSystem | None = None) -> None:
        self._folder = StoredFolder(url, fs)
        self.url, self.fs, self._path = self._folder.url, self._folder.fs, self._folder.path

    def listing(self) -> list[RemoteCheckpoint]:
        """The complete checkpoints, oldest first, one per step (of the latest attempt
        that completed it); one listing of the job's prefix."""
        by_step = {c.step: c for c in self._scan().values() if c is not None}
        return [by_step[step] for step in sorted(by_step)]

    def newest(self) -> RemoteCheckpoint | None:
        done = self.listing()
        return done[-1] if done else None

    def upload(self, name: str, files: Iterable[tuple[str, BinaryIO]], rank: RankOf) -> int:
        """Copy one rank's finished `step-*` directory `name` up (`files`: its files by
        relative path, open for reading), then that rank's marker. The bytes copied."""
        if not _STEP.fullmatch(name):
            raise ValueError(f"{name} is not a checkpoint directory name")
        target, copied = f"{self._path}/attempt-{rank.attempt}/{name}", 0
        for count, (relative, source) in enumerate(files, start=1):
            if count > MAX_FILES:
                raise ValueError(f"{name} holds more than {MAX_FILES} files")
            if relative.startswith(f"{MARKERS}/") or ".." in relative.split("/"):
                continue  # a program's file posing as a marker
            copied += put_open_file(self.fs, f"{target}/{relative}", source)
        self.fs.pipe_file(f"{target}/{MARKERS}/{rank.rank}-of-{rank.world_size}", b"")
        return copied

    def download(self, checkpoint: RemoteCheckpoint, into: Path) -> Path:
        """Copy `checkpoint` into `into/<its step directory's name>` (markers left out);
        the local path."""
        local = into / f"{PREFIX}{checkpoint.step:08d}"
        source = self.fs._strip_protocol(checkpoint.url)
        unplaced = get_files(self.fs, source, checkpoint.files, local)
        if unplaced:  # ranks wrote a file and a folder of one name: not a checkpoint
            raise ValueError(f"{checkpoint.url} holds a file and a folder named {unplaced[0]}")
        return local

    def prune(self, keep_last: int) -> list[str]:
        """Keep the newest `keep_last` complete checkpoints; delete every step directory
        (of any attempt, complete or not) older than the oldest kept: a newer incomplete
        one may still be uploading. The directories deleted."""
        scanned = self._scan()
        done = sorted({c.step for c in scanned.values() if c is not None})
        if len(done) <= keep_last:
            return []
        oldest_kept = done[-max(1, keep_last)]
        gone = [key for key in scanned if key[1] < oldest_kept]
        for attempt, step in gone:
            self.fs.rm(f"{self._path}/attempt-{attempt}/{PREFIX}{step:08d}", recursive=True)
        return [f"attempt-{attempt}/{PREFIX}{step:08d}" for attempt, step in gone]

    def delete(self) -> bool:
        """Delete every checkpoint of the job; whether there was anything."""
        return self._folder.delete()

    def _scan(self) -> dict[tuple[int, int], RemoteCheckpoint | None]:
        """Every (attempt, step) directory, by attempt then step: its checkpoint if
        complete, else None."""
        files: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
        # No prefix yet is an empty listing; a missing bucket or an endpoint that cannot be
        # reached raises: read as "no checkpoint", it would restart the job from scratch.
        for path, info in self.fs.find(self._path, detail=True).items():
            parts = str(path)[len(self._path) :].strip("/").split("/", 2)
            if len(parts) < 3:
                continue
            attempt, step = _ATTEMPT.fullmatch(parts[0]), _STEP.fullmatch(parts[1])
            if attempt and step:
                files[(int(attempt.group(1)), step_of(Path(parts[1])))][parts[2]] = info
        return {key: self._complete(key, files[key]) for key in sorted(files)}

    def _complete(
        self, key: tuple[int, int], files: dict[str, dict[str, Any]]
    ) -> RemoteCheckpoint | None:
        attempt, step = key
        markers = [_MARKER.fullmatch(n[len(MARKERS) + 1 :]) for n in files if _is_marker(n)]
        worlds = {int(m.group(2)) for m in markers if m}
        ranks = {int(m.group(1)) for m in markers if m}
        if ".metadata" not in files or len(worlds) != 1 or ranks != set(range(worlds.pop())):
            return None
        data = {name: info for name, info in files.items() if not _is_marker(name)}
        finished = max(modified(info) for name, info in files.items() if _is_marker(name))
        return RemoteCheckpoint(
            url=f"{self.url}/attempt-{attempt}/{PREFIX}{step:08d}",
            step=step,
            bytes=sum(int(info.get("size") or 0) for info in data.values()),
            saved_at=finished,
            files=tuple(sorted(data)),
        )


class CheckpointStore:
    """Every job's checkpoints under a root URL (`GANGWAY_STORAGE_URL`/checkpoints)."""

    def __init__(self, url: str, fs: AbstractFileSystem | None = None) -> None:
        self.url = url.rstrip("/")
        self._fs = fs if fs is not None else filesystem(self.url)[0]

    def job_url(self, job_id: int) -> str:
        return f"{self.url}/job-{job_id}"

    def job(self, job_id: int) -> JobCheckpointStore:
        return JobCheckpointStore(self.job_url(job_id), self._fs)


def _is_marker(name: str) -> bool:
    return name.startswith(f"{MARKERS}/")
