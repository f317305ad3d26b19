"""SQL persistence. The repositories here are the only code in Gangway that speaks SQL:
`JobRepository` (one store per aggregate: jobs.py for jobs, events and idempotency,
telemetry.py for logs and metrics, nodes.py, leases.py; fencing.py checks a
leader's lease generation in its writes), `AccountRepository` (users
and API keys), `QueueRepository` (queue quotas), `ModelRegistry` (models, versions, aliases)."""

from scheduler.store.accounts import (
    AccountRepository,
    ApiKey,
    ApiKeyNotFound,
    User,
    UserExists,
    UserNotFound,
)
from scheduler.store.db import make_engine
from scheduler.store.fencing import Fence, Fenced, FenceSlot
from scheduler.store.migrate import upgrade_to_head
from scheduler.store.queues import QueueNotFound, QueueRepository
from scheduler.store.records import (
    EventRecord,
    IllegalTransition,
    JobEnded,
    JobNotFound,
    JobRecord,
    KeyReused,
    LogLine,
    MetricPoint,
    NewJob,
    ProgressNote,
    ProgressPoint,
    StaleState,
    WaitNote,
)
from scheduler.store.registry import ModelRegistry
from scheduler.store.repository import JobRepository

__all__ = [
    "AccountRepository",
    "ApiKey",
    "ApiKeyNotFound",
    "EventRecord",
    "Fence",
    "FenceSlot",
    "Fenced",
    "IllegalTransition",
    "JobEnded",
    "JobNotFound",
    "JobRecord",
    "JobRepository",
    "KeyReused",
    "LogLine",
    "MetricPoint",
    "ModelRegistry",
    "NewJob",
    "ProgressNote",
    "ProgressPoint",
    "QueueNotFound",
    "QueueRepository",
    "StaleState",
    "User",
    "UserExists",
    "UserNotFound",
    "WaitNote",
    "make_engine",
    "upgrade_to_head",
]
