"""Gangway's Python SDK: submit and follow distributed training jobs.

from gangway import Client, Builtin, Parallelism
job = Client().submit(name="demo", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=50))
job.wait()

Inside a job, `from gangway import report; report(step=..., val_acc=...)` reports metrics.

`AsyncClient` (gangway.aio) offers the same calls to asyncio code.


The names load on first use (PEP 562): a rank program that imports `gangway.models`
imports no HTTP client with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gangway.aio import AsyncClient, AsyncJob
    from gangway.client import Client, Job
    from gangway.errors import (
        APIError,
        Conflict,
        Forbidden,
        GangwayError,
        JobFailed,
        NotFound,
        TransportError,
        Unauthorized,
        Unavailable,
        ValidationFailed,
        WaitTimeout,
    )
    from gangway.models import (
        Builtin,
        ClusterInfo,
        Command,
        Function,
        JobEvent,
        JobExplanation,
        JobInfo,
        JobLogs,
        JobPage,
        JobState,
        JobSubmit,
        LogLine,
        OutputFile,
        OutputsPage,
        Parallelism,
        Resources,
        Script,
        Straggler,
    )
    from gangway.reporting import report

_SOURCES = {
    "APIError": "gangway.errors",
    "AsyncClient": "gangway.aio",
    "AsyncJob": "gangway.aio",
    "Builtin": "gangway.models",
    "Client": "gangway.client",
    "ClusterInfo": "gangway.models",
    "Command": "gangway.models",
    "Conflict": "gangway.errors",
    "Forbidden": "gangway.errors",
    "Function": "gangway.models",
    "GangwayError": "gangway.errors",
    "Job": "gangway.client",
    "JobEvent": "gangway.models",
    "JobExplanation": "gangway.models",
    "JobFailed": "gangway.errors",
    "JobInfo": "gangway.models",
    "JobLogs": "gangway.models",
    "JobPage": "gangway.models",
    "JobState": "gangway.models",
    "JobSubmit": "gangway.models",
    "LogLine": "gangway.models",
    "NotFound": "gangway.errors",
    "OutputFile": "gangway.models",
    "OutputsPage": "gangway.models",
    "Parallelism": "gangway.models",
    "Resources": "gangway.models",
    "report": "gangway.reporting",
    "Script": "gangway.models",
    "Straggler": "gangway.models",
    "TransportError": "gangway.errors",
    "Unauthorized": "gangway.errors",
    "Unavailable": "gangway.errors",
    "ValidationFailed": "gangway.errors",
    "WaitTimeout": "gangway.errors",
}


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'gangway' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


__all__ = [
    "APIError",
    "AsyncClient",
    "AsyncJob",
    "Builtin",
    "Client",
    "ClusterInfo",
    "Command",
    "Conflict",
    "Forbidden",
    "Function",
    "GangwayError",
    "Job",
    "JobEvent",
    "JobExplanation",
    "JobFailed",
    "JobInfo",
    "JobLogs",
    "JobPage",
    "JobState",
    "JobSubmit",
    "LogLine",
    "NotFound",
    "OutputFile",
    "OutputsPage",
    "Parallelism",
    "Resources",
    "Script",
    "Straggler",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "ValidationFailed",
    "WaitTimeout",
    "report",
]
