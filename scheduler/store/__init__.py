"""SQL persistence. `JobRepository` is the only code in Gangway that speaks SQL."""

from scheduler.store.db import make_engine
from scheduler.store.migrate import upgrade_to_head
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
    "EventRecord",
    "IllegalTransition",
    "JobEnded",
    "JobNotFound",
    "JobRecord",
    "JobRepository",
    "KeyReused",
    "LogLine",
    "MetricPoint",
    "NewJob",
    "ProgressPoint",
    "StaleState",
    "make_engine",
    "upgrade_to_head",
]
