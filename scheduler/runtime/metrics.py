"""What the scheduling loop counts, for Prometheus (`GET /metrics` serves it).

Counters live in the process that runs the loop and restart from zero with it (Prometheus'
`rate()` and `increase()` handle counter resets). What the store can answer at scrape
time (jobs by state, GPUs allocated) is collected from it instead: see `api/metrics.py`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

PASS_SECONDS = Histogram(
    "gangway_scheduling_pass_seconds",
    "Duration of one scheduling pass (load, decide, persist, apply, poll).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
SUBMIT_TO_START_SECONDS = Histogram(
    "gangway_submit_to_start_seconds",
    "From submission to the first time all of a job's ranks started.",
    ["queue"],
    buckets=(1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
    registry=REGISTRY,
)
PREEMPTIONS = Counter(
    "gangway_preemptions_total",
    "Gangs sent a stop notice to make room for another job.",
    ["queue"],
    registry=REGISTRY,
)
RESIZES = Counter(
    "gangway_resizes_total",
    "Elastic jobs restarted at another data-parallel degree.",
    ["queue"],
    registry=REGISTRY,
)
RESTARTS = Counter(
    "gangway_restarts_total",
    "Failed gangs placed again within their max_restarts.",
    ["queue"],
    registry=REGISTRY,
)
LOST_STEPS = Counter(
    "gangway_lost_steps_total",
    "Training steps redone because a gang stopped or failed after its last checkpoint.",
    ["queue"],
    registry=REGISTRY,
)
