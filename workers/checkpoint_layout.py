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
is being listed is left out, never an error.
"""

from __future__ import annotations

import re
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
