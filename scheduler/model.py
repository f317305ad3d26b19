"""Domain types shared by the policy core, the store and the runtime.

They are frozen dataclasses, not the wire models in `gangway.models`: the core must not
depend on pydantic or on what the REST API happens to look like today.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gangway.states import Condition as Condition  # re-exported, as JobState is
from gangway.states import JobState as JobState  # re-exported: part of this contract

# The user the service's own calibration runs belong to (`scheduler.runtime.calibration`):
# a name no account may take, whose runs teach the step-time model and nothing else.
CALIBRATION_USER = "gangway"

# States in which a job's placement is reserved on the cluster.
RESOURCE_HOLDING_STATES = frozenset(
    {
        JobState.ADMITTED,
        JobState.STARTING,
        JobState.RUNNING,
        JobState.RESTARTING,
        JobState.PREEMPTING,
        JobState.RESIZING,
    }
)

# Holding states the loop drives toward running (PREEMPTING it drives out, RESIZING
# through a checkpoint and a new launch).
ACTIVE_STATES = (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)
UNFINISHED_STATES = tuple(state for state in JobState if not state.is_terminal)

# Every legal edge. Any non-terminal state may go to CANCELLED (user) or FAILED (an error
# the runtime cannot recover from). An active state may go back to PENDING when the runtime
# lost the job through no fault of its own (service restart, placement never satisfied):
# principle 7, "cannot reach the job" is not "the job failed".
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.ADMITTED}),
    JobState.ADMITTED: frozenset({JobState.STARTING, JobState.PENDING}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.PENDING}),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.PREEMPTING,
            JobState.RESIZING,
            JobState.RESTARTING,
            JobState.PENDING,
        }
    ),
    JobState.RESTARTING: frozenset({JobState.STARTING, JobState.PENDING}),
    # SUCCEEDED: the job finished its last step before it could stop.
    JobState.PREEMPTING: frozenset({JobState.PENDING, JobState.SUCCEEDED}),
    # ADMITTED: relaunched at the new dp, from the checkpoint it wrote on the notice.
    JobState.RESIZING: frozenset({JobState.ADMITTED, JobState.SUCCEEDED, JobState.RESTARTING}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
for _state in JobState:
    if not _state.is_terminal:
        TRANSITIONS[_state] = TRANSITIONS[_state] | {JobState.CANCELLED, JobState.FAILED}


def is_legal_transition(old: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[old]


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Degrees of data, tensor and pipeline parallelism; world size is their product."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallelism.{name} must be >= 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of `rank` in the (pp, dp, tp) device mesh the ranks build,
        tp innermost: ranks of one tensor-parallel group are consecutive."""
        tp_index = rank % self.tp
        dp_index = rank // self.tp % self.dp
        return rank // (self.tp * self.dp), dp_index, tp_index


@dataclass(frozen=True, slots=True)
class GangShape:
    """What the placement core needs to know about a job: how many ranks, what each needs,
    and which ranks must share a node (one tensor-parallel group)."""

    parallelism: Parallelism
    gpus_per_rank: int = 1
    cpus_per_rank: float = 1.0
    # Elastic jobs: dp may be anywhere in [dp_min, dp_max]; `parallelism.dp` is the degree
    # this shape describes (the current one for a running job, dp_max for a pending one).
    dp_min: int | None = None
    dp_max: int | None = None
    # The GPU types its ranks may run on (None: any) and whether one gang may mix them.
    # Unmixed, a gang runs on one type: a synchronous gang steps at its slowest GPU's pace.
    gpu_types: frozenset[str] | None = None
    mix_gpu_types: bool = False
    # Derived once: the scheduling pass reads these millions of times.
    num_ranks: int = field(init=False, repr=False, compare=False)
    num_gpus: int = field(init=False, repr=False, compare=False)
    # The fewest GPUs it runs on: an elastic gang's at dp_min (what it must find free at
    # once to start or restart), else `num_gpus`. The gang-size rules order by this.
    min_gpus: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self.parallelism
        replica_gpus = p.tp * p.pp * self.gpus_per_rank
        object.__setattr__(self, "num_ranks", p.dp * p.tp * p.pp)
        object.__setattr__(self, "num_gpus", p.dp * replica_gpus)
        min_dp = p.dp if self.dp_min is None else self.dp_min
        object.__setattr__(self, "min_gpus", min_dp * replica_gpus)
        if (self.dp_min is None) != (self.dp_max is None):
            raise ValueError("give both dp_min and dp_max, or neither")
        low, high = self.dp_min, self.dp_max
        if low is not None and high is not None and not 1 <= low <= high:
            raise ValueError("parallelism.dp needs 1 <= min <= max")

    @property
    def elastic(self) -> bool:
        return self.dp_min is not None and self.dp_min != self.dp_max

    def with_dp(self, dp: int) -> GangShape:
        p = self.parallelism
        return replace(self, parallelism=Parallelism(dp=dp, tp=p.tp, pp=p.pp))

    @property
    def replica_ranks(self) -> int:
        """Ranks in one data-parallel replica (its tp x pp block)."""
        return self.parallelism.tp * self.parallelism.pp

    @property
    def ranks_per_group(self) -> int:
        """Ranks that must land on one node: a tensor-parallel group (tp is innermost)."""
        return self.parallelism.tp


@dataclass(frozen=True, slots=True)
class BuiltinEntrypoint:
    """The built-in trainer. `settings` are its fields as submitted (their names, types
    and defaults are defined once, by `gangway.models.Builtin`); the ranks read them."""

    settings: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FunctionEntrypoint:
    """`module:function` called on every rank with `kwargs`."""

    target: str
    kwargs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptEntrypoint:
    """A Python script run in a child process per rank, torchrun-style."""

    path: str
    args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CommandEntrypoint:
    """A command line run in a child process per rank, torchrun-style, in the job's
    working directory."""

    argv: tuple[str, ...]


EntrypointSpec = BuiltinEntrypoint | FunctionEntrypoint | ScriptEntrypoint | CommandEntrypoint


@dataclass(frozen=True, slots=True)
class CodeSpec:
    """The job's own code and environment: a shipped working directory (its package's
    sha256), pip requirement lines, environment variables for the ranks, and `secrets`:
    more variables for the ranks, whose values the API never shows (kept out of repr so
    no log line does either)."""

    package: str | None = None
    requirements: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    interval_steps: int | None  # None: only on stop and at the end
    keep_last: int


@dataclass(frozen=True, slots=True)
class ObjectiveSpec:
    """The reported metric whose best value a job keeps, and which way is better."""

    metric: str
    mode: str  # "min" | "max"

    def better(self, value: float, than: float | None) -> bool:
        if than is None:
            return True
        return value < than if self.mode == "min" else value > than


@dataclass(frozen=True, slots=True)
class ModelInit:
    """Start from a registered model's version (an alias was pinned to its number)."""

    name: str
    version: int


@dataclass(frozen=True, slots=True)
class CheckpointInit:
    """Start from another job's checkpoint: the one at `step`, or its newest complete one
    when this job launches."""

    job_id: int
    step: int | None = None


# What a built-in trainer job keeps when it declares no objective of its own.
BUILTIN_OBJECTIVE = ObjectiveSpec("val_loss", "min")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job asked for, typed, as the service reads it below the API. Built by one
    function from the stored JSON (`scheduler.store.specs.spec_from_json`); the wire model
    (`gangway.models.JobSubmit`) holds every default, so none is restated here."""

    shape: GangShape  # an elastic job's at its largest dp
    fsdp: bool
    entrypoint: EntrypointSpec
    max_restarts: int
    time_limit_s: float | None
    preemptible: bool
    checkpoint: CheckpointSpec
    code: CodeSpec = CodeSpec()
    objective: ObjectiveSpec | None = None  # the declared one, or the built-in default
    init_from: ModelInit | CheckpointInit | None = None  # the weights it starts from
    inputs_from: tuple[int, ...] = ()  # jobs whose outputs it reads

    def placed(self, placement: Sequence[str] | None) -> GangShape:
        """The gang as placed: an elastic job runs at the dp its placement shows."""
        if not placement:
            return self.shape
        return self.shape.with_dp(len(placement) // self.shape.replica_ranks)


UNKNOWN_GPU_TYPE = ""  # the key of nodes whose GPUs' type is not known


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the cluster reports it. `id` is Ray's node id."""

    id: str
    name: str
    num_gpus: int
    num_cpus: float
    alive: bool = True
    rack: str | None = None  # nodes of one rack/block share fast links
    gpu_type: str | None = None  # "H100", "A100", ...; None: not known
    # Its GPUs' speed relative to the cluster's reference type (a step takes 1 / speed
    # of the reference's time), as the runtime knows it: measured, else a seed table.
    gpu_speed: float = 1.0

    @property
    def gpu_type_key(self) -> str:
        """Its GPU type as speed tables and placement key it: UNKNOWN_GPU_TYPE when not
        known (one more type, which no job can name)."""
        return self.gpu_type or UNKNOWN_GPU_TYPE


@dataclass(frozen=True, slots=True)
class Placement:
    """rank -> node id, index = rank. The executor pins bundle i to `node_ids[i]`."""

    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the runtime has measured of a job that holds resources.

    The core estimates when the job ends from these (never from the true duration):
    `time_limit_s` when the user gave one, else steps left x measured step time.
    """

    started_at: datetime
    step: int = 0
    total_steps: int | None = None
    step_time_s: float | None = None
    steps_since_checkpoint: int = 0
    # Seconds of work since the newest checkpoint, where the runtime measured them (the
    # steps since it x the step time rank 0 measured); None: `steps_since_checkpoint` x
    # `step_time_s`. The mean step time above includes start-up, and a resumed attempt's
    # step counts earlier attempts' steps: right for the end estimate, not for the loss.
    since_checkpoint_s: float | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """One job as the scheduling core sees it (pending or holding resources)."""

    id: int
    priority: int
    submitted_at: datetime
    state: JobState
    shape: GangShape
    placement: Placement | None = None
    preemptible: bool = True
    time_limit_s: float | None = None
    run: RunInfo | None = None
    queue: str = "default"
    user: str = "default"
    # GPU-seconds consumed by the job's earlier, ended runs (the current run's share is
    # added from `run.started_at`): least-attained-service ranks jobs by it.
    attained_gpu_s: float = 0.0
    # When the job last entered PENDING (None: at submit). Aging counts from here, so a
    # preempted job starts its wait again instead of jumping the queue at once.
    queued_at: datetime | None = None
    # Predicted run time still ahead of the job on its gang (`scheduler.predict`); None:
    # unknown. Used where no time limit or measured progress says more: ends on the
    # release timeline (backfill, ETAs), service order within a band, preemption payoff.
    predicted_remaining_s: float | None = None
    # Why it may not start until someone releases it (a paused sweep trial); None: free.
    hold: str | None = None
    # How readily to preempt it among equals: a sweep trial's place at its latest rung,
    # 0 (the best there) to 1 (the worst); 0 for every other job.
    expendable: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """A queue's share of the cluster.

    `guaranteed_gpus` are the queue's own: it gets them back by preempting jobs of other
    queues that borrowed them. Beyond that it may borrow idle GPUs, up to
    `borrow_limit_gpus` more (None: any idle GPUs); borrowed GPUs are reclaimed first.
    `weight` is the queue's share when queues contend for the same GPUs: queues are taken
    in order of recent usage divided by weight (a queue of weight 2 may use twice as much
    before it yields). A queue with no QueueQuota configured has no guarantee, no
    borrowing limit and weight 1.
    """

    guaranteed_gpus: int = 0
    borrow_limit_gpus: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError("weight must be > 0")
        if self.guaranteed_gpus < 0:
            raise ValueError("guaranteed_gpus must be >= 0")
        if self.borrow_limit_gpus is not None and self.borrow_limit_gpus < 0:
            raise ValueError("borrow_limit_gpus must be >= 0")

    @property
    def max_gpus(self) -> int | None:
        if self.borrow_limit_gpus is None:
            return None
        return self.guaranteed_gpus + self.borrow_limit_gpus


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The nodes at one instant. Usage is derived from the jobs that hold placements."""

    nodes: tuple[Node, ...] = field(default_factory=tuple)
