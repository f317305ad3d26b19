"""`JobRepository`: the jobs database as one object, made of one store per aggregate.

Each aggregate lives in its own module (jobs.py: jobs, events, idempotency; telemetry.py:
logs and metrics; reported.py: what jobs report; dependencies.py: jobs that wait for
jobs; nodes.py; leases.py); callers that need
the whole database take this.
"""

from __future__ import annotations

from scheduler.store.dependencies import DependencyStore
from scheduler.store.jobs import JobStore
from scheduler.store.leases import LeaseStore
from scheduler.store.nodes import NodeStore
from scheduler.store.predictions import PredictionStore
from scheduler.store.reported import ReportedMetricStore
from scheduler.store.telemetry import TelemetryStore


class JobRepository(
    JobStore,
    DependencyStore,
    TelemetryStore,
    ReportedMetricStore,
    NodeStore,
    LeaseStore,
    PredictionStore,
):
    """Every read and write of jobs, their dependencies, events, logs, metrics (sampled
    and reported), nodes, leases and predictions."""
