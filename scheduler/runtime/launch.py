"""What the ranks receive: the one function that turns a job's spec into their entrypoint.

Submit-time validation calls it too (api/validation.py), so what is checked is what runs.
No Ray or torch here: the API imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.model import BuiltinEntrypoint, FunctionEntrypoint, JobSpec, ScriptEntrypoint
from workers.checkpoint_layout import job_directory


def rank_entrypoint(spec: JobSpec, job_id: int, checkpoint_root: Path | None) -> dict[str, Any]:
    """The entrypoint the ranks run, plus what only the service knows: the job's
    checkpoint directory (the same on every attempt, so a requeued or restarted job
    resumes from its newest checkpoint) and policy; the built-in trainer also gets the
    FSDP switch."""
    entry = spec.entrypoint
    launch: dict[str, Any]
    if isinstance(entry, BuiltinEntrypoint):
        launch = {
            **entry.settings,
            "kind": "builtin",
            "fsdp": spec.fsdp,
            "checkpoint_interval_steps": spec.checkpoint.interval_steps,
        }
    elif isinstance(entry, FunctionEntrypoint):
        launch = {"kind": "function", "target": entry.target, "kwargs": dict(entry.kwargs)}
    elif isinstance(entry, ScriptEntrypoint):
        return {"kind": "script", "path": entry.path, "args": list(entry.args)}
    if checkpoint_root is not None:
        launch["checkpoint_dir"] = str(job_directory(checkpoint_root, job_id))
        launch["keep_last"] = spec.checkpoint.keep_last
    return launch
