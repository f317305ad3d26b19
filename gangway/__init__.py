"""Gangway's Python SDK: submit and follow distributed training jobs.

from gangway import Client, Builtin, Parallelism
job = Client().submit(name="demo", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=50))
"""

from gangway.client import Client, Job
from gangway.errors import (
    APIError,
    Conflict,
    GangwayError,
    JobFailed,
    NotFound,
    TransportError,
    ValidationFailed,
    WaitTimeout,
)
from gangway.models import (
    Builtin,
    ClusterInfo,
    Function,
    JobEvent,
    JobExplanation,
    JobInfo,
    JobLogs,
    JobPage,
    JobState,
    JobSubmit,
    LogLine,
    Parallelism,
    Resources,
    Script,
    Straggler,
)

__all__ = [
    "APIError",
    "Builtin",
    "Client",
    "ClusterInfo",
    "Conflict",
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
    "Parallelism",
    "Resources",
    "Script",
    "Straggler",
    "TransportError",
    "ValidationFailed",
    "WaitTimeout",
]
