"""The wire contract between the server and its clients (principle 11).

The server validates requests with these models and returns them; the SDK parses responses
with the very same classes. Unknown fields are errors, so a typo never silently changes a job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gangway.reporting import METRIC_NAME as METRIC_NAME  # re-exported: part of this contract
from gangway.states import JobState as JobState  # re-exported: part of this contract


def _integral(value: Any) -> Any:
    """JSON has one kind of number: 4.0 is the integer 4, as JSON Schema says. Strict
    models still refuse what is not a number (true, "4")."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def wire_default(model: type[BaseModel], name: str) -> Any:
    """A field's default as the wire model declares it: the CLI's flags and the ranks'
    plan and training spec take theirs from here, so each default is written once."""
    return model.model_fields[name].default


class ElasticDP(_Strict):
    """An elastic data-parallel degree: the job starts with the largest degree in
    [min, max] that fits, and the scheduler may grow or shrink it within the range."""

    min: Int = Field(ge=1, le=4096)
    max: Int = Field(ge=1, le=4096)

    @model_validator(mode="after")
    def _ordered(self) -> ElasticDP:
        if self.min > self.max:
            raise ValueError("min must be <= max")
        return self


def _dp_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | ElasticDP) else "degree"


DataParallel = Annotated[
    Annotated[Int, Field(ge=1, le=4096), Tag("degree")] | Annotated[ElasticDP, Tag("range")],
    Discriminator(_dp_kind),
]

# Union members name themselves in pydantic's error locations; a user's field path omits them.
_UNION_TAGS = frozenset(
    {"builtin", "function", "script", "command", "degree", "range", "plan", "auto"}
    | {"model-version", "job-checkpoint", "uniform", "log_uniform", "int", "choice"}
)


def field_path(loc: Sequence[int | str]) -> str:
    """Pydantic's error location -> the dotted path of the field in the request body."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(p for p in parts if p not in _UNION_TAGS)


class Parallelism(_Strict):
    """Degrees of data, tensor and pipeline parallelism; ranks = dp * tp * pp."""

    dp: DataParallel = Field(1, description="a degree, or {min, max} for an elastic job")
    tp: Int = Field(1, ge=1, le=64)
    pp: Int = Field(1, ge=1, le=256)
    fsdp: bool = Field(
        False,
        description="shard parameters, gradients and optimizer state over dp (FSDP2, "
        "ZeRO-3) instead of replicating them",
    )


GPU_TYPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Resources(_Strict):
    gpus_per_rank: Int = Field(1, ge=1, le=16)
    cpus_per_rank: float = Field(1.0, gt=0, le=1024)
    gpu_types: list[Annotated[str, Field(pattern=GPU_TYPE_NAME)]] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="GPU types the ranks may run on, as the nodes name them (H100, A100); "
        "null: any. The gang goes on the fastest of them that can hold it",
    )
    mix_gpu_types: bool = Field(
        False,
        description="let one gang span GPU types when no single type holds it (it then "
        "steps at its slowest GPU's pace unless the trainer balances the work)",
    )


# The built-in trainer's choices, named once: the ranks' plan and spec take these types.
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zbv"]
# Schedules that give each pipeline rank two model chunks (virtual stages): interleaved
# 1F1B places rank r's at stages r and r + pp, ZB-V at r and 2 pp - 1 - r (a "V").
TWO_CHUNK_SCHEDULES: frozenset[str] = frozenset({"interleaved-1f1b", "zbv"})
Precision = Literal["fp32", "bf16"]
Compression = Literal["none", "fp16", "bf16", "powersgd"]
UpdateMode = Literal["sync", "local-sgd", "diloco", "adaptive", "async"]
Optimizer = Literal["adamw", "sgd"]


class Instability(_Strict):
    """What the built-in trainer does on a bad step: a loss or gradient norm that is NaN
    or infinite, or a loss spike (above `spike_factor` x the median loss of the last
    `spike_window` good steps). `fail` ends the job naming the step and the value;
    `skip` drops the step's update; `rollback` restores the newest checkpoint, skips the
    data from there to the end of the bad step's batch, multiplies the learning rate by
    `lr_scale`, and fails once `max_rollbacks` have not helped (with no checkpoint yet, it
    drops the update as `skip` does). Every action is an event of the job."""

    action: Literal["fail", "skip", "rollback"] = "rollback"
    spike_factor: float | None = Field(
        3.0, gt=1, le=1e6, description="null: only NaN and Inf are bad steps"
    )
    spike_window: Int = Field(50, ge=5, le=100_000, description="good steps the median spans")
    max_rollbacks: Int = Field(3, ge=0, le=1000, description="per job, across its attempts")
    lr_scale: float = Field(1.0, gt=0, le=1, description="learning rate x this per rollback")


class PauseBar(_Strict):
    """Set by a sweep's early stopping: at `step` (one of `pause_at`) the trainer goes on
    without stopping when its `metric` there is better than `better_than` (null: whatever
    it is), since the sweep would let it go on anyway; a stop and a restart cost a trial
    seconds of GPU time for nothing."""

    step: Int = Field(ge=1)
    metric: str = Field(pattern=METRIC_NAME)
    mode: Literal["min", "max"] = "min"
    better_than: float | None = Field(default=None, allow_inf_nan=False)


class Builtin(_Strict):
    """The built-in trainer: a GPT-style model on synthetic tokens."""

    kind: Literal["builtin"] = "builtin"
    model: str = Field("gpt-tiny", min_length=1, max_length=100)
    steps: Int = Field(100, ge=1, le=10_000_000)
    batch_size: Int = Field(8, ge=1, le=4096)
    learning_rate: float = Field(3e-3, gt=0, le=1)
    seed: Int = Field(0, ge=0, le=2**31 - 1)
    warmup_steps: Int = Field(0, ge=0, description="linear LR warmup, then cosine decay")
    grad_accumulation: Int = Field(1, ge=1, le=1024)
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip; null: no clipping")
    microbatches: Int = Field(1, ge=1, le=1024, description="per step, for the pipeline")
    pipeline_schedule: PipelineSchedule = "1f1b"
    precision: Precision = "fp32"
    grad_compression: Compression = Field(
        "none", description="DDP communication hook (pure data parallel only)"
    )
    activation_checkpointing: bool = False
    sequence_parallel: bool = Field(
        False, description="with tp > 1, also shard norms and the residual stream by sequence"
    )
    data_path: str | None = Field(
        None, max_length=4096, description="uint16 token file (nanoGPT .bin); null: synthetic"
    )
    optimizer: Optimizer = "adamw"
    update_mode: UpdateMode = Field(
        "sync",
        description="sync: all-reduce gradients every step; local-sgd: average parameters "
        "every sync_period steps; diloco: plus an outer Nesterov step; adaptive: local SGD "
        "whose period follows the replicas' drift; async: a parameter server on rank 0 "
        "applies each rank's gradient unless it is over max_staleness updates old (pure "
        "data parallel)",
    )
    sync_period: Int = Field(8, ge=1, le=100_000, description="H: steps between averages")
    outer_lr: float = Field(0.7, gt=0, le=10, description="diloco's outer learning rate")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="diloco's Nesterov momentum")
    drift_target: float = Field(
        0.01, gt=0, le=1, description="adaptive: relative replica spread to stay under"
    )
    max_staleness: Int = Field(
        4, ge=0, le=10_000, description="async: the oldest parameters an applied update may use"
    )
    balance_stages: bool = Field(
        False, description="pipeline stages by measured cost (may cut inside a block)"
    )
    balance_batch: bool = Field(False, description="smaller batch shares for slower dp ranks")
    eval_every: Int | None = Field(
        50,
        ge=1,
        le=10_000_000,
        description="steps between validation passes on the held-out split (and one at the "
        "end): val_loss, val_perplexity, val_token_accuracy; null: none",
    )
    eval_batches: Int = Field(
        4, ge=1, le=100_000, description="batches of batch_size per dp rank in one pass"
    )
    on_instability: Instability = Field(default_factory=Instability)
    pause_at: list[Annotated[Int, Field(ge=1)]] = Field(
        default_factory=list,
        max_length=64,
        description="set by a sweep's early stopping (a submit with it is refused): steps "
        "at which the trainer saves a checkpoint and stops; the job then waits, held, "
        "until the sweep releases it, and resumes from there",
    )
    pause_unless: list[PauseBar] = Field(
        default_factory=list,
        max_length=64,
        description="set by a sweep's early stopping with pause_at (a submit with it is "
        "refused): the bars that let the trainer go on past a pause_at step",
    )


# A function's kwargs travel in the job's stored spec and in every listing of it.
MAX_KWARGS_BYTES = 16 * 1024
MAX_ARG_CHARS = 4096
# Validation context of a body read back from the store: limits added after it was
# submitted must not make an accepted job unreadable (a 500 on every listing).
STORED = {"stored": True}


def _stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


def _arg_fits(arg: str, info: ValidationInfo) -> str:
    if len(arg) > MAX_ARG_CHARS and not _stored(info):
        raise ValueError(f"{len(arg)} characters; at most {MAX_ARG_CHARS}")
    return arg


class Function(_Strict):
    """A Python function `package.module:function(ctx, **kwargs)` run on every rank."""

    kind: Literal["function"] = "function"
    target: str = Field(min_length=3, max_length=300)
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description=f"at most {MAX_KWARGS_BYTES} bytes as JSON"
    )

    @field_validator("kwargs")
    @classmethod
    def _kwargs_fit(cls, kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if _stored(info):
            return kwargs
        size = len(json.dumps(kwargs, separators=(",", ":")).encode())
        if size > MAX_KWARGS_BYTES:
            raise ValueError(f"kwargs is {size} bytes as JSON; at most {MAX_KWARGS_BYTES}")
        return kwargs


# No operating system takes a NUL byte in a path or an argument.
NO_NUL = r"^[^\x00]*$"


class Script(_Strict):
    """An unmodified torchrun-style script, run by every rank in its own Python process
    with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); its output is captured. A relative path is taken from the
    service's working directory."""

    kind: Literal["script"] = "script"
    path: str = Field(min_length=1, max_length=4096, pattern=NO_NUL)
    args: list[Annotated[str, Field(pattern=NO_NUL), AfterValidator(_arg_fits)]] = Field(
        default_factory=list,
        max_length=1000,
        description=f"at most 1000, each <= {MAX_ARG_CHARS} chars",
    )


class Command(_Strict):
    """A command line (`["python", "train.py", "--lr", "3e-4"]`) run by every rank in its
    own process, in the job's working directory, with the variables torchrun sets (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT)."""

    kind: Literal["command"] = "command"
    argv: list[Annotated[str, Field(min_length=1, max_length=4096, pattern=NO_NUL)]] = Field(
        min_length=1, max_length=1000
    )


def _entrypoint_kind(value: Any) -> str:
    """`kind` picks the entrypoint; without one it is the built-in trainer (whose fields
    all have defaults), as the schema says."""
    if isinstance(value, dict):
        return str(value.get("kind", "builtin"))
    return str(getattr(value, "kind", "builtin"))


Entrypoint = Annotated[
    Annotated[Builtin, Tag("builtin")]
    | Annotated[Function, Tag("function")]
    | Annotated[Script, Tag("script")]
    | Annotated[Command, Tag("command")],
    Discriminator(_entrypoint_kind),
]


# A package's id: the sha256 of its zip, in hex.
PACKAGE_ID = r"^[0-9a-f]{64}$"
# What a process environment takes as a name.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"
# Environment variables for the ranks: `env` and `secrets` take the same names and values.
EnvVars = dict[
    Annotated[str, Field(pattern=ENV_NAME)],
    Annotated[str, Field(max_length=32_768, pattern=NO_NUL)],
]
# What a job's `env` values read as for a caller who is neither its owner nor an admin.
REDACTED = "***"


class CheckpointPolicy(_Strict):
    """When the built-in trainer writes a checkpoint (also on a stop notice and at the end);
    a restarted or preempted job resumes from the newest one."""

    interval_steps: Int | None = Field(None, ge=1, description="null: only on stop and at end")
    keep_last: Int = Field(2, ge=1, le=100)


MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
# Starts with a letter: a version is named by its number or by an alias, never ambiguously.
ALIAS_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$"


class ModelRef(_Strict):
    """A registered model's version, by number or by alias. A submitted job stores the
    number the alias pointed at then (its lineage stays what it ran from)."""

    model: str = Field(pattern=MODEL_NAME)
    version: (
        Annotated[Int, Field(ge=1, le=2**31 - 1)] | Annotated[str, Field(pattern=ALIAS_NAME)]
    ) = Field(description="a version number, or an alias (production, staging, ...)")


JOB_ID = Annotated[Int, Field(ge=1, le=2**31 - 1)]
STEP_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$"
# A job by id; within a pipeline also an earlier step by its name.
JobOrStep = JOB_ID | Annotated[str, Field(pattern=STEP_NAME)]
ConditionName = Literal["succeeded", "ended", "failed", "started"]
MAX_DEPENDENCIES = 64


class Dependency(_Strict):
    """Wait for another job until `on` holds (Slurm's afterok / afterany / afternotok /
    after): it `succeeded`; `ended` in any way; `failed` (FAILED or CANCELLED); or
    `started` running. A condition that can no longer hold cancels the waiting job."""

    job: JobOrStep = Field(description="a job id (yours); in a pipeline, an earlier step's name")
    on: ConditionName = "succeeded"


class Upstream(NamedTuple):
    """A job a submit names as one it waits for (`JobSubmit.named_upstream`)."""

    job: JobOrStep
    on: ConditionName
    field: str  # where the body names it, for a 422
    source: Literal["depends_on", "init_from", "inputs_from"]


class CheckpointRef(_Strict):
    """Another job's checkpoint: its newest complete one when this job starts, or the one
    at `step`. The job must be the caller's; this job waits for it to succeed unless
    `depends_on` names it with another condition."""

    job: JobOrStep = Field(description="a job id (yours); in a pipeline, an earlier step's name")
    step: Annotated[Int, Field(ge=1, le=2**31 - 1)] | None = None


def _init_kind(value: Any) -> str:
    """A body's `{job: ...}` or a parsed CheckpointRef (when dumped) is a checkpoint."""
    job = isinstance(value, CheckpointRef) or (isinstance(value, dict) and "job" in value)
    return "job-checkpoint" if job else "model-version"


InitFrom = Annotated[
    Annotated[ModelRef, Tag("model-version")] | Annotated[CheckpointRef, Tag("job-checkpoint")],
    Discriminator(_init_kind),
]


class Objective(_Strict):
    """A metric the job reports and which way is better."""

    metric: str = Field(pattern=METRIC_NAME)
    mode: Literal["min", "max"] = "min"


def _plan_kind(value: Any) -> str:
    return "auto" if value == "auto" else "plan"


PlanOrAuto = Annotated[
    Annotated[Parallelism, Tag("plan")] | Annotated[Literal["auto"], Tag("auto")],
    Discriminator(_plan_kind),
]


class JobSubmit(_Strict):
    name: str = Field(min_length=1, max_length=200)
    priority: Int = Field(0, ge=-1_000_000, le=1_000_000, description="higher runs first")
    queue: str = Field("default", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    user: str = Field(
        "default",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_.@-]+$",
        description="who the job counts against for fair share; with auth, the key's user "
        "unless an admin submits for someone else",
    )
    parallelism: PlanOrAuto = Field(
        default_factory=Parallelism,
        description='"auto": the service picks the plan that finishes soonest and fits '
        "memory within `gpu_budget` (built-in trainer; the job's first event says which)",
    )
    gpu_budget: Int | None = Field(
        None, ge=1, le=4096, description='with parallelism "auto": at most this many GPUs'
    )
    resources: Resources = Field(default_factory=Resources)
    entrypoint: Entrypoint
    max_restarts: Int = Field(0, ge=0, le=100)
    time_limit_s: Int | None = Field(
        None,
        ge=1,
        le=365 * 24 * 3600,
        description="also lets the job start on GPUs held for a reserved job when it ends "
        "before that start",
    )
    preemptible: bool = Field(True, description="may be stopped for a higher-priority job")
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    init_from: InitFrom | None = Field(
        None,
        description="start from weights: a registered model version's ({model, version}: "
        "the caller must be able to read the model) or another of the caller's jobs' "
        "checkpoint ({job, step?}); the built-in trainer loads them when the job has no "
        "checkpoint of its own, and any rank reads the files at MODEL_DIR",
    )
    depends_on: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="jobs this one waits for, each with a condition; until all hold it "
        "stays PENDING and takes no place in the queue",
    )
    inputs_from: list[JobOrStep] = Field(
        default_factory=list,
        max_length=16,
        description="jobs (yours; in a pipeline, earlier steps by name) whose outputs this "
        "one reads: it waits for each to succeed, and every rank finds each one's outputs "
        "read-only at INPUTS_DIR/job-<id>/rank-<r>/",
    )
    objective: Objective | None = Field(
        None,
        description="the reported metric whose best value the job keeps; null: val_loss, "
        "lowest best, for the built-in trainer, none for other jobs",
    )
    package: str | None = Field(
        None,
        pattern=PACKAGE_ID,
        description="the job's working directory: the sha256 of a zip uploaded to "
        "PUT /v1/packages/{sha256}; the ranks run in it on every node",
    )
    requirements: list[Annotated[str, Field(min_length=1, max_length=1000, pattern=NO_NUL)]] = (
        Field(
            default_factory=list,
            max_length=500,
            description="requirements installed by pip in a virtualenv per node, each "
            "'name[extras] specifier ; marker'; pip options, URLs and paths only where the "
            "service's admin allows them (else a 422 naming requirements.N)",
        )
    )
    env: EnvVars = Field(
        default_factory=dict,
        max_length=500,
        description="environment variables for the ranks; they see nothing of the service's. "
        f"Read back by the job's owner and admins; others read each value as {REDACTED!r}",
    )
    secrets: EnvVars = Field(
        default_factory=dict,
        max_length=500,
        exclude=True,  # no dump writes them: no response can carry them (see submit_body)
        json_schema_extra={"writeOnly": True},
        description="environment variables for the ranks whose values are never returned, "
        "to anyone: a job shows only their names (`secret_names`); a name is in env or "
        "here, not both",
    )

    def named_upstream(self) -> list[Upstream]:
        """Every job this one waits for, as named, with its condition: `depends_on`'s
        first, then the job whose checkpoint `init_from` names and those whose outputs
        `inputs_from` names (their success). A job named twice waits on its first
        condition, so `depends_on` decides. The one rule the API checks at submit and a
        sweep applies to each trial body."""
        named = [
            Upstream(d.job, d.on, f"depends_on.{i}.job", "depends_on")
            for i, d in enumerate(self.depends_on)
        ]
        if isinstance(self.init_from, CheckpointRef):
            named.append(Upstream(self.init_from.job, "succeeded", "init_from.job", "init_from"))
        named += [
            Upstream(job, "succeeded", f"inputs_from.{i}", "inputs_from")
            for i, job in enumerate(self.inputs_from)
        ]
        return named

    @field_validator("depends_on")
    @classmethod
    def _each_job_once(cls, deps: list[Dependency]) -> list[Dependency]:
        """One condition per upstream job: two would be a contradiction or a repeat."""
        seen = [d.job for d in deps]
        repeated = sorted({str(j) for j in seen if seen.count(j) > 1})
        if repeated:
            raise ValueError(f"job {', '.join(repeated)} named more than once")
        return deps

    @field_validator("secrets")
    @classmethod
    def _secrets_apart_from_env(
        cls, secrets: dict[str, str], info: ValidationInfo
    ) -> dict[str, str]:
        """One name, one value: a rank's variable must not depend on which one wins."""
        both = sorted(set(secrets) & set(info.data.get("env", {})))
        if both and not _stored(info):
            raise ValueError(f"{', '.join(both)} also in env: a name is in one of the two")
        return secrets


def submit_body(spec: JobSubmit, *, mode: Literal["json", "python"] = "json") -> dict[str, Any]:
    """The body to send or store: every field, the write-only `secrets` too when there are
    any (a plain dump leaves them out, so that nothing which shows a job can show them;
    without any, the body is what it was before secrets existed)."""
    body = spec.model_dump(mode=mode)
    if spec.secrets:
        body["secrets"] = dict(spec.secrets)
    return body


class RankPlacement(BaseModel):
    rank: int
    node_id: str
    node_name: str
    pp_rank: int = Field(description="pipeline stage: the rank's index on the pp axis")
    dp_rank: int = Field(description="data-parallel replica: its index on the dp axis")
    tp_rank: int = Field(description="its index within the tensor-parallel group")


class Straggler(BaseModel):
    """A rank persistently slower than its peers in work that waits on no peer."""

    rank: int
    node_name: str
    local_s: float = Field(description="its median seconds of local work per step")
    ratio: float = Field(description="that over the gang's median")


class ObjectiveValue(BaseModel):
    """The best value of the job's objective so far, and where it was reported."""

    metric: str
    mode: Literal["min", "max"]
    value: float
    step: int
    attempt: int
    at: datetime


class Progress(BaseModel):
    step: int
    total_steps: int | None
    loss: float | None
    first_loss: float | None
    tokens_per_s: float | None
    updated_at: datetime | None
    objective: ObjectiveValue | None = Field(
        None, description="the best value of the job's objective so far"
    )
    stragglers: list[Straggler] = Field(
        default_factory=list, description="ranks of this attempt flagged as slow"
    )


class WaitExplanation(BaseModel):
    """Why a pending job is not running: the constraint that failed and what unblocks it."""

    blocker: str = Field(description="cluster_full | node_shape | reservation | preempting | quota")
    message: str
    unblock: str
    blocking_job_id: int | None = None
    queue_position: int | None = Field(
        None, description="1 = next to be considered, in the scheduler's order"
    )


class RuntimePrediction(BaseModel):
    """How long the service expects a job to run, and from what."""

    runtime_s: float | None = Field(description="total run time; null: unknown")
    remaining_s: float | None = Field(description="of which still ahead; null: unknown")
    low_s: float | None = Field(
        None,
        description="history: quartile range of similar jobs; model: the run time at its "
        "expected error either way (null when that is unknown: assumed speeds)",
    )
    high_s: float | None = None
    source: Literal["steps", "model", "history", "unknown"] = Field(
        description="steps: measured step time x steps left; model: the step-time model; "
        "history: similar finished jobs; unknown: nothing similar has finished"
    )
    basis: str = Field(description="the evidence, in plain text")
    step_time_s: float | None = None


class JobInfo(BaseModel):
    id: int
    name: str
    queue: str
    user: str
    priority: int
    state: JobState
    status_reason: str
    error: str | None
    num_gpus: int
    attempt: int
    restarts: int
    submitted_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    spec: JobSubmit = Field(
        description=f"as submitted, without its secrets; env values read as {REDACTED!r} "
        "for callers who are neither the job's owner nor an admin"
    )
    secret_names: list[str] = Field(
        default_factory=list, description="names of the job's secrets (values never shown)"
    )
    placement: list[RankPlacement] | None
    progress: Progress
    estimated_start_at: datetime | None = Field(
        None, description="pending jobs: when the scheduler expects it to start"
    )
    explanation: WaitExplanation | None = None
    prediction: RuntimePrediction | None = Field(
        None, description="the service's latest run-time prediction (null: none made yet)"
    )
    estimated_end_at: datetime | None = Field(
        None, description="running: now + predicted remaining; pending: start + run time"
    )
    pipeline_id: int | None = Field(None, description="the pipeline it is a step of")


MAX_PIPELINE_JOBS = 100


class PipelineSubmit(_Strict):
    """Jobs submitted together, all or none: each job's `name` is its step name, unique in
    the pipeline, and a step's `depends_on` and `init_from` may name an earlier step by
    it (its success is what `init_from` waits for). Every step is the same user's."""

    name: str = Field(min_length=1, max_length=200)
    jobs: list[JobSubmit] = Field(min_length=1, max_length=MAX_PIPELINE_JOBS)

    @field_validator("jobs")
    @classmethod
    def _step_names_unique(cls, jobs: list[JobSubmit]) -> list[JobSubmit]:
        names = [job.name for job in jobs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"step name {', '.join(map(repr, repeated))} used more than once")
        return jobs


class PipelineInfo(BaseModel):
    id: int
    name: str
    user: str
    submitted_at: datetime
    state: JobState = Field(
        description="RUNNING while a step holds GPUs, PENDING while steps only wait; once "
        "all ended: SUCCEEDED if all did, else FAILED if one did, else CANCELLED"
    )
    jobs: list[JobInfo] = Field(description="its steps, in the order submitted")


class Uniform(_Strict):
    """A float between `low` and `high`; a grid takes `points` evenly spaced values."""

    kind: Literal["uniform"]
    low: float
    high: float
    points: Int = Field(3, ge=1, le=100, description="values on a grid")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        return self


class LogUniform(_Strict):
    """A float between `low` and `high`, drawn evenly in log space (learning rates)."""

    kind: Literal["log_uniform"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    points: Int = Field(3, ge=1, le=100, description="values on a grid (log-spaced)")

    @model_validator(mode="after")
    def _ordered(self) -> LogUniform:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        return self


class IntRange(_Strict):
    """An integer in [low, high], every `step`-th (a grid takes them all)."""

    kind: Literal["int"]
    low: Int
    high: Int
    step: Int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if not self.low <= self.high or (self.high - self.low) // self.step >= 1000:
            raise ValueError("need low <= high and at most 1000 values")
        return self


Scalar = bool | Int | float | Annotated[str, Field(max_length=1000)]


class Choice(_Strict):
    """One of `values` (batch sizes, schedules, an argument's words)."""

    kind: Literal["choice"]
    values: list[Scalar] = Field(min_length=1, max_length=50)


Dimension = Annotated[Uniform | LogUniform | IntRange | Choice, Field(discriminator="kind")]
# A field of the job body by dotted path: a key, or a list index (`entrypoint.argv.2`).
SWEEP_PATH = (
    r"^(entrypoint|parallelism|resources|env|checkpoint)(\.[A-Za-z0-9_]+)+$"
    r"|^(time_limit_s|max_restarts)$"
)


class EarlyStopping(_Strict):
    """ASHA: rungs at `min_steps x reduction_factor^k` steps; a trial goes past a rung only
    in the top 1/reduction_factor there, else it pauses (checkpoint kept, GPUs freed) until
    promoted. `min_steps` null: the budget / reduction_factor^2 (three rungs). Hyperband:
    one ASHA per rung, each starting its trials there (the last runs them to the end),
    trials dealt to them in Hyperband's proportions; values compared within one only."""

    rule: Literal["asha", "hyperband"] = "asha"
    min_steps: Int | None = Field(None, ge=1)
    reduction_factor: Int = Field(3, ge=2, le=10)
    max_steps: Int | None = Field(
        None, ge=1, description="a trial's whole budget; null: the built-in trainer's steps"
    )


class SweepSubmit(_Strict):
    """A search over a job's fields. Trials are ordinary jobs of the base job's user,
    queue and priority, each with its parameters applied to the base body at their paths;
    at most `max_concurrent` at a time, `max_trials` in all."""

    # A trial is named `<name>-<number>`, within a job name's 200 characters.
    name: str = Field(min_length=1, max_length=190)
    base: JobSubmit
    space: dict[Annotated[str, Field(pattern=SWEEP_PATH, max_length=200)], Dimension] = Field(
        min_length=1,
        max_length=10,
        description="dotted paths into the job body (entrypoint.learning_rate, "
        "entrypoint.batch_size, entrypoint.argv.2, env.WARMUP, ...) and their ranges",
    )
    objective: Objective | None = Field(
        None, description="null: the built-in trainer's val_loss, lowest best"
    )
    searcher: Literal["grid", "random", "tpe"] = "random"
    early_stopping: EarlyStopping | None = None
    max_trials: Int | None = Field(
        None, ge=1, le=1000, description="null: the grid's size (grid), else 16"
    )
    max_concurrent: Int = Field(4, ge=1, le=100)
    seed: Int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _not_kind_or_code(self) -> SweepSubmit:
        """A trial runs the base job's code: the kind, script and target stay put."""
        fixed = {"entrypoint.kind", "entrypoint.path", "entrypoint.target"}
        touched = sorted(fixed & set(self.space))
        if touched:
            raise ValueError(f"{', '.join(touched)} cannot be searched: trials run one code")
        return self


class SweepTrialInfo(BaseModel):
    number: int
    job_id: int
    params: dict[str, Any]
    state: Literal["running", "paused", "completed", "stopped", "failed"]
    job_state: JobState
    bracket: int = Field(0, description="Hyperband's bracket: the rung it started at")
    rung: int = Field(description="the rung it works toward, or stopped at")
    objective: float | None = Field(None, description="its value at the highest rung reached")
    rung_values: dict[int, float] = Field(description="rung -> the objective there")
    step: int
    gpu_seconds: float
    moved_at: datetime = Field(description="when its job last moved: ended, or last step")


class SweepBest(BaseModel):
    trial: int
    value: float
    params: dict[str, Any]
    job: JobSubmit = Field(description="the base job with the best parameters: submit it")


class SweepInfo(BaseModel):
    id: int
    name: str
    user: str
    state: Literal["RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]
    reason: str
    submitted_at: datetime
    finished_at: datetime | None
    objective: Objective
    searcher: str
    space: dict[str, Dimension] = Field(description="the dimensions searched, by path")
    early_stopping: Literal["asha", "hyperband"] | None = Field(
        None, description="the early-stopping rule; null: every trial runs its budget"
    )
    rung_steps: list[int] = Field(description="the rule's rungs in steps; empty without one")
    max_trials: int
    max_concurrent: int
    trials: list[SweepTrialInfo]
    best: SweepBest | None = Field(None, description="among trials that ran their budget")
    gpu_seconds: float


class DependencyLink(BaseModel):
    """One end of a dependency: the other job, the condition, and whether it still waits
    (`waiting`), was met (`met_at`), or neither (the waiting job was cancelled)."""

    job: int
    name: str
    state: JobState
    on: ConditionName
    waiting: bool
    met_at: datetime | None = None


class JobDependencies(BaseModel):
    upstream: list[DependencyLink]  # the jobs this one waits (or waited) for
    downstream: list[DependencyLink]  # the jobs that wait (or waited) for this one


class JobPatch(_Strict):
    """What may change after submission."""

    priority: Int = Field(ge=-1_000_000, le=1_000_000, description="higher runs first")


class JobExplanation(BaseModel):
    """Why the job is where it is, and for a pending one when it should start."""

    job_id: int
    state: JobState
    reason: str = Field(description="the scheduler's latest word on the job, in plain text")
    queue: str
    priority: int
    queue_position: int | None = None
    estimated_start_at: datetime | None = None
    blocker: str | None = Field(None, description="pending jobs: the constraint that failed")
    message: str | None = None
    unblock: str | None = Field(None, description="pending jobs: what would let it start")
    blocking_job_id: int | None = None
    queued_s: float | None = Field(None, description="pending jobs: time in the queue so far")
    attained_gpu_hours: float = Field(description="GPU time this job has had, all attempts")
    upstream: list[DependencyLink] = Field(
        default_factory=list, description="the jobs it waits (or waited) for"
    )
    downstream: list[DependencyLink] = Field(
        default_factory=list, description="the jobs that wait (or waited) for it"
    )


class JobPage(BaseModel):
    items: list[JobInfo]
    next_cursor: int | None = Field(description="pass as `cursor` to get the next page")


class JobEvent(BaseModel):
    id: int
    at: datetime
    from_state: JobState | None
    to_state: JobState
    reason: str


class LogLine(BaseModel):
    attempt: int
    rank: int
    seq: int = Field(description="the line's number within its rank and attempt")
    line: str
    id: int = Field(0, description="cursor: `after=` or Last-Event-ID reads on from here")


class MetricPoint(BaseModel):
    """Rank 0's report as one scheduler poll saw it."""

    attempt: int
    step: int
    at: datetime
    loss: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    memory_mb: float | None = Field(description="peak memory of rank 0's device (or process)")
    comm_s: float | None = Field(
        None, description="seconds of the step in data-parallel collectives (rank 0)"
    )
    comm_bytes: float | None = Field(
        None, description="bytes rank 0 put into data-parallel collectives in the step"
    )


class ReportedValues(BaseModel):
    """One report of the job's rank 0 (every step of the built-in trainer, each
    `ctx.report` or `gangway.report` call): the values it carried, by name."""

    id: int = Field(description="the order of arrival: pass as `after` to read on")
    attempt: int
    step: int
    at: datetime
    values: dict[str, float]


# Shown first, in this order, after the job's objective; the rest by name.
_USUAL_METRICS = ("loss", "val_loss", "val_token_accuracy", "grad_norm", "lr", "tokens_per_s")


def metric_order(names: Sequence[str], objective: str | None) -> list[str]:
    """The job's metric names as a reader wants them: the objective, the usual training
    curves, then the rest by name."""
    first = [n for n in (objective, *_USUAL_METRICS) if n is not None and n in names]
    return list(dict.fromkeys(first)) + sorted(n for n in names if n not in first)


class JobMetrics(BaseModel):
    points: list[MetricPoint] = Field(
        description="the service's samples (loss, tokens/s, step time, memory, "
        "communication): oldest first, evenly thinned to max_points"
    )
    names: list[str] = Field(
        default_factory=list, description="every metric name the job has reported"
    )
    reported: list[ReportedValues] = Field(
        default_factory=list,
        description="what the job reported, every point, in order of arrival (a page: see "
        "next_cursor); with `name`, only the points carrying one of those names",
    )
    next_cursor: int | None = Field(
        None, description="pass as `after` for the next page of `reported`; null: no more"
    )
    objective: ObjectiveValue | None = None


class JobLogs(BaseModel):
    lines: list[LogLine]


class NodeInfo(BaseModel):
    id: str
    name: str
    alive: bool
    gpu_type: str | None = Field(None, description="null: not known")
    gpu_speed: float = Field(
        1.0, description="its GPU type's speed relative to H100: measured, else a seed table"
    )
    gpus_total: int
    gpus_allocated: int
    gpus_free: int
    cpus_total: float
    jobs: list[int]
    gpu_holders: list[int | None] = Field(
        description="one entry per GPU: the job holding it, or null; jobs fill the node's "
        "GPUs in id and rank order (which device Ray hands each rank is its own choice)"
    )


class ClusterInfo(BaseModel):
    nodes: list[NodeInfo]
    gpus_total: int
    gpus_allocated: int
    gpus_free: int


class CheckpointInfo(BaseModel):
    step: int
    path: str
    bytes: int
    saved_at: datetime


class JobCheckpoints(BaseModel):
    directory: str | None = Field(
        description="the job's checkpoint directory, or its URL in a store (null: none)"
    )
    checkpoints: list[CheckpointInfo] = Field(description="complete ones, oldest first")


class OutputFile(BaseModel):
    """A file a job's rank wrote to its OUTPUTS_DIR, as the service stored it."""

    path: str = Field(description="relative to the job's outputs, '/'-separated")
    bytes: int
    rank: int = Field(description="whose copy this is; merged view: the lowest rank that has it")
    modified_at: datetime


class OutputsUsage(BaseModel):
    """What the job's owner holds in storage, against their quota: the outputs of all
    their jobs and the versions of the models they own, which share it."""

    user: str
    used_bytes: int = Field(description="outputs and model versions together")
    model_bytes: int = Field(0, description="of those, what their model versions hold")
    quota_bytes: int = Field(description="GANGWAY_STORAGE_QUOTA_BYTES")


class OutputsPage(BaseModel):
    files: list[OutputFile] = Field(description="sorted by path, component by component")
    next_cursor: str | None = Field(
        description="the last path of this page when more follow: pass it as `cursor`"
    )
    total_bytes: int = Field(
        description="what the job's outputs hold in storage, every rank's copies included"
    )
    usage: OutputsUsage | None = Field(
        description="the owner's use of their quota, on the first page (no cursor) only: "
        "it sums every job of theirs"
    )


class QueueInfo(BaseModel):
    """A queue's share of the cluster and what it holds now."""

    name: str
    guaranteed_gpus: int = Field(description="its own: reclaimed from borrowers when needed")
    borrow_limit_gpus: int | None = Field(description="more it may borrow; null: any idle")
    weight: float = Field(description="its share when queues contend for GPUs")
    gpus_in_use: int = Field(description="held by its admitted and running jobs")
    gpus_borrowed: int = Field(description="of those, beyond its guarantee (reclaimed first)")
    jobs_pending: int
    jobs_holding_gpus: int
    members: list[str] = Field(
        default_factory=list,
        description="who may submit to it (admins always may); empty: every user",
    )


QueueName = Annotated[
    str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$", description="queue")
]
UserName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$")]
Role = Literal["user", "admin"]


class QueueSpec(_Strict):
    """What an admin sets for a queue (PUT /v1/queues/{name})."""

    guaranteed_gpus: Int = Field(0, ge=0, le=1_000_000, description="reclaimed when needed")
    borrow_limit_gpus: Int | None = Field(
        None, ge=0, le=1_000_000, description="idle GPUs it may borrow beyond; null: any"
    )
    weight: float = Field(
        1.0,
        gt=0,
        le=1_000_000,
        description="share when queues contend: they go in order of recent usage / weight",
    )


class QueueMembers(_Strict):
    """Who a queue is for (PUT /v1/queues/{name}/members): only they (and admins) submit
    to it, and they read the models shared with `queue:<name>`. Empty: every user."""

    members: list[UserName] = Field(max_length=10_000)


class UserCreate(_Strict):
    name: UserName
    role: Role = "user"


class UserInfo(BaseModel):
    name: str
    role: Role
    created_at: datetime


class ApiKeyInfo(BaseModel):
    id: int
    user: str
    prefix: str = Field(description="the secret's first characters, to tell keys apart")
    created_at: datetime
    revoked_at: datetime | None


class IssuedApiKey(ApiKeyInfo):
    secret: str = Field(description="send as `Authorization: Bearer <secret>`; shown once")


class WhoAmI(BaseModel):
    name: str
    role: Role
    auth_enabled: bool = Field(description="false: the service lets everyone in as admin")
    queues: list[str] = Field(
        default_factory=list, description="the queues the caller is a member of"
    )


class PredictionAccuracy(BaseModel):
    """Run-time predictions made while jobs waited, against how long they then ran."""

    predicted: int = Field(description="succeeded jobs that had a prediction")
    unknown: int = Field(description="succeeded jobs whose prediction was unknown")
    median_ape: float | None = Field(description="median absolute percentage error (0.1: 10%)")
    spearman: float | None = Field(description="rank correlation of predicted and actual")


class Estimate(BaseModel):
    """What the service expects of a job if it were submitted now."""

    step_time_s: float | None = Field(description="built-in trainer: predicted s/step")
    prediction: RuntimePrediction
    estimated_start_at: datetime | None = Field(description="earliest start on this cluster now")
    estimated_end_at: datetime | None
    parallelism: Parallelism = Field(description="the plan estimated (chosen, with auto)")
    batch_size: int | None = Field(None, description="with auto: per dp rank and micro-step")
    grad_accumulation: int | None = None
    microbatches: int | None = None
    plan_reason: str | None = Field(None, description="with auto: why this plan")
    wait_reason: str | None = Field(None, description="why it could not start at once")


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class PackageInfo(BaseModel):
    """An uploaded working directory, named by the sha256 of its zip."""

    sha256: str
    size_bytes: int
    created_at: datetime
    last_used_at: datetime


class ErrorBody(BaseModel):
    error: ErrorDetail
    errors: list[ErrorDetail] = Field(default_factory=list)


# -- the model registry -----------------------------------------------------------------

USER_NAME = r"^[A-Za-z0-9_.@-]{1,100}$"
Readers = list[
    Annotated[
        str,
        Field(
            pattern=r"^(queue:[A-Za-z0-9_.-]{1,100}|[A-Za-z0-9_.@-]{1,100})$",
            description="a user's name, or `queue:<name>`: that queue's members",
        ),
    ]
]


class ModelRegister(_Strict):
    """Make the next version of model `name` from a complete checkpoint of job
    `job_id` (its newest, or the one at `step`). A new model is the caller's, readable by
    `readers` too; a version of an existing one may only be added by its owner or an admin."""

    name: str = Field(pattern=MODEL_NAME)
    job_id: Int = Field(ge=1, le=2**63 - 1)
    step: Int | None = Field(None, ge=0, description="null: the job's newest checkpoint")
    readers: Readers = Field(
        default_factory=list, max_length=1000, description="for a new model: who may read it"
    )


class ModelFile(BaseModel):
    path: str
    bytes: int
    sha256: str


class ModelVersionInfo(BaseModel):
    """An immutable version: where it came from, what it measured, what it holds."""

    model: str
    version: int
    aliases: list[str] = Field(description="the aliases on this version")
    job_id: int = Field(description="lineage: the job whose checkpoint this is")
    attempt: int
    step: int
    spec: dict[str, Any] = Field(description="that job's spec as submitted (env values hidden)")
    metrics: dict[str, float] = Field(description="what the job reported at that step")
    files: list[ModelFile]
    bytes: int
    created_by: str
    created_at: datetime


class ModelInfo(BaseModel):
    name: str
    owner: str
    readers: list[str]
    created_at: datetime
    aliases: dict[str, int] = Field(default_factory=dict, description="alias -> version")
    versions: list[ModelVersionInfo] = Field(default_factory=list, description="oldest first")


class ModelList(BaseModel):
    models: list[ModelInfo] = Field(description="those the caller may read, by name (no versions)")


class AliasSet(_Strict):
    version: Int = Field(ge=1, le=2**31 - 1)


class ReadersSet(_Strict):
    readers: Readers = Field(max_length=1000)


class ModelExport(_Strict):
    """Export a version for deployment, as a job on the cluster (loading a model needs
    memory): one consolidated safetensors file whatever the dp/tp/pp it was trained with,
    with `quantize: int8` an int8 copy too; each one's validation loss on the held-out
    split. The files are the job's outputs (`gangway download JOB`), `export.json`
    beside them."""

    format: Literal["safetensors"] = "safetensors"
    quantize: Literal["none", "int8"] = "none"
    queue: QueueName = Field("default", description="the queue the export job waits in")
    eval_batches: Int = Field(4, ge=1, le=10_000, description="validation batches per file")
