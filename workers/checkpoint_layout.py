"""Where a job's checkpoints live and which are complete. Torch-free, so the API can list
them without importing the engine.

`<root>/job-<id>/step-00000120/`: one directory per checkpoint, the same job directory on
every attempt (a requeued or restarted job resumes from its newest). A save is written
into `.partial-step-00000120/` and renamed to its final name only once every rank has
written and DCP has written its `.metadata` (the last file it writes): a `step-*`
directory is never written in place, so a crash mid-save leaves the previous checkpoint
in charge and nothing half-written under a final name. A checkpoint counts when its name
is `step-<digits>` and it holds `.metadata`; anything else there is ignored.

Listings run while rank 0 prunes old checkpoints: a checkpoint that disappears while it
is being listed is left out, never an error. `ListingCache` lists a directory again only
when one of its `step-*` entries came, went or changed.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

PREFIX = "step-"
PARTIAL = ".partial-"
_NAME = re.compile(rf"{PREFIX}(\d+)")


@dataclass(frozen=True)
class CheckpointFiles:
    path: Path
    step: int
    bytes: int
    saved_at: datetime


def job_directory(root: Path, job_id: int) -> Path:
    return root / f"job-{job_id}"


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"{PREFIX}{step:08d}"


def partial_path(directory: Path, step: int) -> Path:
    """Where a save at `step` is written before it is renamed to `checkpoint_path`."""
    return directory / f"{PARTIAL}{PREFIX}{step:08d}"


def is_complete(checkpoint: Path) -> bool:
    return _NAME.fullmatch(checkpoint.name) is not None and (checkpoint / ".metadata").is_file()


def completed(directory: Path) -> list[Path]:
    """Complete checkpoints in `directory`, oldest (lowest step) first."""
    try:
        entries = list(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((p for p in entries if is_complete(p)), key=step_of)


def step_of(checkpoint: Path) -> int:
    match = _NAME.fullmatch(checkpoint.name)
    if match is None:
        raise ValueError(f"{checkpoint.name} is not a checkpoint directory name")
    return int(match.group(1))


def listing(directory: Path) -> list[CheckpointFiles]:
    """Complete checkpoints with their size and time, oldest first; one removed while
    this runs (rank 0 pruning) is left out."""
    found = []
    for path in completed(directory):
        try:
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            mtime = (path / ".metadata").stat().st_mtime
        except FileNotFoundError:
            continue
        saved_at = datetime.fromtimestamp(mtime, UTC)
        found.append(CheckpointFiles(path, step_of(path), size, saved_at))
    return found


# What a listing depends on: each `step-*` entry's name and modification time.
Stamp = tuple[tuple[str, int], ...]


def stamp(directory: Path) -> Stamp | None:
    """The name and mtime of every `step-*` entry (None: no directory). An entry comes,
    goes or changes its mtime when a save is renamed into place, rank 0 prunes, or a
    file is added inside it (`.metadata` last); a listing changes only with these."""
    try:
        with os.scandir(directory) as entries:
            found = []
            for entry in entries:
                if entry.name.startswith(PREFIX):
                    try:
                        found.append((entry.name, entry.stat().st_mtime_ns))
                    except FileNotFoundError:
                        continue  # pruned as we looked
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tuple(sorted(found))


class ListingCache:
    """`listing(directory)` done again only when the directory's `stamp` changed: the
    status page polls a job's checkpoints every few seconds, and a listing stats every
    file of every checkpoint. A stamp holding an mtime from the last `settle_s` is not
    trusted (a file system's clock ticks coarsely: a change in the same tick would keep
    it), so a directory that just changed is listed each time until it settles."""

    def __init__(
        self,
        *,
        max_directories: int = 1024,
        settle_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._max = max_directories
        self._settle_ns = int(settle_s * 1e9)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Path, tuple[Stamp, list[CheckpointFiles]]] = OrderedDict()

    def listing(self, directory: Path) -> list[CheckpointFiles]:
        before = stamp(directory)
        if before is None:
            return []
        with self._lock:
            cached = self._entries.get(directory)
            if cached is not None and cached[0] == before:
                self._entries.move_to_end(directory)
                return list(cached[1])
        found = listing(directory)
        newest = max((mtime for _, mtime in before), default=0)
        if int(self._clock() * 1e9) - newest >= self._settle_ns:
            with self._lock:
                self._entries[directory] = (before, found)
                self._entries.move_to_end(directory)
                while len(self._entries) > self._max:
                    self._entries.popitem(last=False)
        return list(found)
