"""`GET /metrics`: Prometheus text format.

Two sources: the loop's counters and histograms (`scheduler.runtime.metrics`, kept in this
process) and gauges read from the store at scrape time (jobs by state and queue, queue
depth, GPUs), so a standby service reports the same jobs as the leader.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.convert import cluster_info
from scheduler.model import RESOURCE_HOLDING_STATES, JobState
from scheduler.runtime import metrics as runtime_metrics
from scheduler.store import JobRepository

router = APIRouter()


class StoreCollector(Collector):
    def __init__(self, repo: JobRepository) -> None:
        self._repo = repo

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "gangway_jobs", "Jobs by state and queue.", labels=["state", "queue"]
        )
        depth = GaugeMetricFamily("gangway_queue_depth", "Pending jobs by queue.", labels=["queue"])
        for (state, queue), count in sorted(self._repo.count_jobs().items()):
            jobs.add_metric([state.value, queue], count)
            if state is JobState.PENDING:
                depth.add_metric([queue], count)
        cluster = cluster_info(self._repo.nodes(), self._repo.in_states(RESOURCE_HOLDING_STATES))
        yield jobs
        yield depth
        yield GaugeMetricFamily(
            "gangway_gpus_total", "GPUs on alive nodes.", value=cluster.gpus_total
        )
        yield GaugeMetricFamily(
            "gangway_gpus_allocated", "GPUs held by admitted jobs.", value=cluster.gpus_allocated
        )


def store_registry(repo: JobRepository) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(repo))
    return registry


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics_registry
    body = generate_latest(runtime_metrics.REGISTRY) + generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
