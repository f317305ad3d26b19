"""SQL persistence. The repositories here are the only code in Gangway that speaks SQL:
`JobRepository` (jobs, events, logs, metrics, nodes), `LeaseStore` (leader leases
and their fences), `AccountRepository` (users
and API keys), `QueueRepository` (queue quotas)."""

from scheduler.store.accounts import (
    AccountRepository,
    ApiKey,
    ApiKeyNotFound,
    User,
    UserExists,
    UserNotFound,
)
from scheduler.store.db import make_engine
from scheduler.store.leases import Fence, Fenced, LeaseStore
from scheduler.store.migrate import upgrade_to_head
from scheduler.store.queues import QueueNotFound, QueueRepository
from scheduler.store.repository import (
    EventRecord,
    IllegalTransition,
    JobEnded,
    JobNotFound,
    JobRecord,
    JobRepository,
    KeyReused,
    LogLine,
    MetricPoint,
    NewJob,
    ProgressPoint,
    StaleState,
)

__all__ = [
    "AccountRepository",
    "ApiKey",
    "ApiKeyNotFound",
    "EventRecord",
    "Fence",
    "Fenced",
    "IllegalTransition",
    "JobEnded",
    "JobNotFound",
    "JobRecord",
    "JobRepository",
    "KeyReused",
    "LeaseStore",
    "LogLine",
    "MetricPoint",
    "NewJob",
    "ProgressPoint",
    "QueueNotFound",
    "QueueRepository",
    "StaleState",
    "User",
    "UserExists",
    "UserNotFound",
    "make_engine",
    "upgrade_to_head",
]
