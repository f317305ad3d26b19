"""Gangway's Python SDK: submit and follow distributed training jobs.

from gangway import Client, Builtin, Parallelism
job = Client().submit(name="demo", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=50))
job.wait()

`AsyncClient` (gangway.aio) offers the same calls to asyncio code.
"""

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
    "ValidationFailed",
    "WaitTimeout",
]
