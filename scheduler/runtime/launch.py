"""What the ranks receive: the one function that turns a job's spec into their entrypoint.

Submit-time validation calls it too (api/validation.py), so what is checked is what runs.
No Ray or torch here: the API imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.model import (
    BuiltinEntrypoint,
    CodeSpec,
    CommandEntrypoint,
    FunctionEntrypoint,
    JobSpec,
    ScriptEntrypoint,
)
from workers.engine.checkpoint_layout import job_directory


def rank_entrypoint(spec: JobSpec, job_id: int, checkpoint_root: Path | None) -> dict[str, Any]:
    """The entrypoint the ranks run, plus what only the service knows: the job's
    checkpoint directory (the same on every attempt, so a requeued or restarted job
    resumes from its newest checkpoint) and policy; the built-in trainer also gets the
    FSDP switch. Every kind gets the job's `env` (the ranks' environment is built from
    it and an allow-list, never the service's) and whether its code was shipped."""
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
        launch = {"kind": "script", "path": entry.path, "args": list(entry.args)}
    elif isinstance(entry, CommandEntrypoint):
        launch = {"kind": "command", "argv": list(entry.argv)}
    if checkpoint_root is not None:
        launch["checkpoint_dir"] = str(job_directory(checkpoint_root, job_id))
        launch["keep_last"] = spec.checkpoint.keep_last
    launch["env"] = dict(spec.code.env)
    launch["shipped"] = spec.code.package is not None
    return launch


def runtime_env(code: CodeSpec, packages_root: Path | None) -> dict[str, Any] | None:
    """Ray's per-actor runtime_env: the shipped working directory as a `file://` URI to its
    zip (Ray unpacks it once per node and caches it by URI; the name is the content hash,
    so a URI never changes meaning), and the pip requirements (a virtualenv per node and
    requirement set, on top of the node's packages)."""
    env: dict[str, Any] = {}
    if code.package is not None:
        if packages_root is None:
            raise ValueError("a job with a working directory needs the packages directory")
        env["working_dir"] = (packages_root / f"{code.package}.zip").resolve().as_uri()
    if code.requirements:
        env["pip"] = list(code.requirements)
    return env or None
