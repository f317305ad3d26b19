"""One scheduling pass: order the queue, place gangs in order, explain who waits and why.

Policy (foundation): strict priority order, then submit time, then job id; a job that
does not fit blocks the jobs behind it (no backfill yet), so a large gang is never
starved by a stream of small ones. No preemption yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from scheduler.core.decisions import Admit, Decision, Wait
from scheduler.core.placement import free_capacity, place_gang
from scheduler.model import (
    RESOURCE_HOLDING_STATES,
    ClusterSnapshot,
    JobState,
    JobView,
    Placement,
)


def queue_order(jobs: Sequence[JobView]) -> list[JobView]:
    """Higher priority first, then earlier submit, then lower id: a total order."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.id))


def schedule(snapshot: ClusterSnapshot, jobs: Sequence[JobView], now: datetime) -> list[Decision]:
    """Decide for every pending job in `jobs`: Admit with a placement, or Wait with a reason.

    `now` is part of the contract (later policies age priorities with it); this policy
    does not read it.
    """
    del now
    holders = [j for j in jobs if j.state in RESOURCE_HOLDING_STATES]
    free = free_capacity(snapshot.nodes, holders)
    pending = queue_order([j for j in jobs if j.state is JobState.PENDING])
    decisions: list[Decision] = []
    blocker: JobView | None = None
    for job in pending:
        if blocker is not None:
            decisions.append(Wait(job.id, _behind_reason(blocker)))
            continue
        placement = place_gang(job.shape, free)
        if placement is None:
            blocker = job
            decisions.append(Wait(job.id, _no_room_reason(job, sum(c.gpus for c in free.values()))))
            continue
        for node_id in placement.node_ids:
            free[node_id] = free[node_id].minus(job.shape.gpus_per_rank, job.shape.cpus_per_rank)
        decisions.append(Admit(job.id, placement, _admit_reason(job, placement)))
    return decisions


def _admit_reason(job: JobView, placement: Placement) -> str:
    nodes = len(set(placement.node_ids))
    return f"first in queue order; {job.shape.num_gpus} GPUs free on {nodes} node(s)"


def _no_room_reason(job: JobView, free_gpus: int) -> str:
    return (
        f"waiting for resources: needs {job.shape.num_gpus} GPUs "
        f"({job.shape.num_ranks} ranks, tp={job.shape.parallelism.tp} per node); "
        f"{free_gpus} GPUs free now"
    )


def _behind_reason(blocker: JobView) -> str:
    return (
        f"waiting behind job {blocker.id} (earlier in queue order), which needs "
        f"{blocker.shape.num_gpus} GPUs and has not started yet"
    )
