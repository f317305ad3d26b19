"""`JobRepository`: the jobs database as one object, made of one store per aggregate.

Each aggregate lives in its own module (jobs.py: jobs, events, idempotency; pipelines.py:
jobs submitted together; sweeps.py: searches whose trials are jobs; dependencies.py: jobs
that wait for jobs; telemetry.py: logs and metrics; reported.py: what jobs report;
nodes.py; leases.py); callers that need the whole database take this.
"""

from __future__ import annotations

from scheduler.store.dependencies import DependencyStore
from scheduler.store.jobs import JobStore
from scheduler.store.leases import LeaseStore
from scheduler.store.nodes import NodeStore
from scheduler.store.pipelines import PipelineStore
from scheduler.store.predictions import PredictionStore
from scheduler.store.reported import ReportedMetricStore
from scheduler.store.sweeps import SweepStore
from scheduler.store.telemetry import TelemetryStore


class JobRepository(
    JobStore,
    PipelineStore,
    SweepStore,
    DependencyStore,
    TelemetryStore,
    ReportedMetricStore,
    NodeStore,
    LeaseStore,
    PredictionStore,
):
    """Every read and write of jobs (alone or as a pipeline's steps), their dependencies,
    events, logs, metrics (sampled and reported), nodes, leases and predictions."""
