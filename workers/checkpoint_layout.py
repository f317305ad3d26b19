"""Where a job's checkpoints live and which are complete. Torch-free, so the API can list
them without importing the engine.

`<root>/job-<id>/step-00000120/`: one directory per checkpoint, the same job directory on
every attempt (a requeued or restarted job resumes from its newest). A checkpoint counts
once DCP has written its `.metadata`, the last file it writes, so a crash mid-save leaves
the previous one in charge.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "step-"


def job_directory(root: Path, job_id: int) -> Path:
    return root / f"job-{job_id}"


def completed(directory: Path) -> list[Path]:
    """Complete checkpoints in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.glob(f"{PREFIX}*") if p.is_dir() and (p / ".metadata").exists()
    )


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix(PREFIX))
