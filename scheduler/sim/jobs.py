"""What the simulator works on: its configuration, a trace job as it moves through the
queue and its runs, the cluster samples, the result, and the gang shape a trace job of
g GPUs takes."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from scheduler.model import GangShape, JobView, Parallelism, Placement
from scheduler.predict.runtime import JobFeatures
from scheduler.sim.trace import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PLACEMENTS = ("consolidated", "count")


@dataclass(frozen=True)
class SimConfig:
    nodes: int
    gpus_per_node: int
    nodes_per_rack: int | None = None
    tick_s: float = 60.0
    wait_tick_s: float = 300.0  # passes while jobs wait and nothing happens (timed policies)
    checkpoint_interval_s: float = 1800.0
    checkpoint_save_s: float = 60.0
    restore_s: float = 60.0
    time_limit_factor: float | None = None
    oracle: bool = False
    placement: str = "consolidated"  # or "count": any free GPUs anywhere (Tiresias' sim)
    # A cluster of several GPU types: (type, nodes) blocks in node order, covering every
    # node; empty: one type. A trace job's duration is its run time on a type of speed 1.
    node_types: tuple[tuple[str, int], ...] = ()
    gpu_speeds: tuple[tuple[str, float], ...] = ()  # by type; missing: the seed table's

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("the cluster needs at least one node with one GPU")
        if self.node_types and sum(count for _, count in self.node_types) != self.nodes:
            raise ValueError("node_types must cover the cluster's nodes exactly")
        if any(count < 1 for _, count in self.node_types):
            raise ValueError("every node type needs at least one node")
        if any(speed <= 0 for _, speed in self.gpu_speeds):
            raise ValueError("gpu_speeds must be > 0")
        unknown = {name for name, _ in self.gpu_speeds} - {name for name, _ in self.node_types}
        if unknown:
            raise ValueError(f"gpu_speeds names types no node has: {', '.join(sorted(unknown))}")
        if min(self.checkpoint_interval_s, self.tick_s, self.wait_tick_s) <= 0:
            raise ValueError("checkpoint_interval_s, tick_s and wait_tick_s must be > 0")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}")


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    STOPPING = "stopping"  # preempted, still holding its GPUs while it stops
    DONE = "done"


@dataclass
class SimJob:
    trace: TraceJob
    shape: GangShape
    phase: Phase = Phase.WAITING
    placement: Placement | None = None
    run_start_s: float = 0.0
    saved_s: float = 0.0  # checkpointed progress
    runs: int = 0
    first_start_s: float | None = None
    finish_s: float | None = None
    attained_gpu_s: float = 0.0  # GPU time consumed by ended runs
    queued_s: float = 0.0  # when it last entered the queue (arrival or requeue)
    waited_s: float = 0.0  # total time queued before each start (queueing delay)
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    version: int = 0  # bumps when a pending end event becomes stale
    predicted_s: float | None = None  # run time predicted at arrival (None: unknown)
    speed: float = 1.0  # of the current run: its slowest GPU's
    # Derived once: what the predictor knows of the job, and its submit time as a datetime.
    features: JobFeatures = field(init=False, repr=False)
    submitted_at: datetime = field(init=False, repr=False)
    # The view of the job while it waits, and what it was built from: rebuilt only when
    # (queued_s, attained_gpu_s, predicted remaining) changed.
    waiting_view: tuple[tuple[float, float, float | None], JobView] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        trace = self.trace
        self.features = JobFeatures(queue=trace.queue, user=trace.queue, num_gpus=trace.num_gpus)
        self.submitted_at = EPOCH + timedelta(seconds=trace.submit_s)

    def progress_s(self, now: float, restore_s: float) -> float:
        """Progress of the current run (seconds of work at speed 1), not yet checkpointed."""
        warmup = restore_s if self.runs > 1 else 0.0
        return max(0.0, now - self.run_start_s - warmup) * self.speed


@dataclass
class Sample:
    """The cluster after one pass, for plots."""

    time_s: float
    busy_gpus: int
    queued_jobs: int


@dataclass
class SimResult:
    policy: str
    jobs: list[SimJob]
    total_gpus: int
    makespan_s: float
    samples: list[Sample] = field(default_factory=list)
    passes: int = 0


def shape_for(num_gpus: int, gpus_per_node: int, placement: str = "consolidated") -> GangShape:
    """A trace job of g GPUs. Consolidated: tensor-parallel groups of the largest of 8, 4,
    2, 1 that divides g and fits a node, data parallel across them. Count (the Tiresias
    simulator's scheme, node boundaries ignored): g ranks of one GPU, each anywhere. A
    trace names no GPU types, so its jobs may take any and span them when they must."""
    if placement == "count":
        return GangShape(Parallelism(dp=num_gpus), mix_gpu_types=True)
    tp = max(t for t in (1, 2, 4, 8) if num_gpus % t == 0 and t <= gpus_per_node)
    return GangShape(Parallelism(dp=num_gpus // tp, tp=tp), mix_gpu_types=True)
