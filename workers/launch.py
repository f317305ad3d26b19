"""What a rank is told to run: the one typed description the service, the rank supervisor
and the rank program share.

The service builds a `JobLaunch` per attempt (`scheduler.runtime.launch`), Ray hands it to
every rank's supervisor with the rank's `RankInfo`, and the supervisor writes the
program's part (`ProgramLaunch`: what to run, where its directories are inside the
sandbox) to a file the program reads. Pydantic models, so each hop is checked and the
program's copy is plain JSON; nothing here imports torch or Ray.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Where the rank program finds its directories inside the sandbox: the same on every
# host, so a job never depends on (or learns) the service's paths.
INSIDE_WORK = "/gangway/work"
INSIDE_CHECKPOINTS = "/gangway/checkpoints"
INSIDE_OUTPUTS = "/gangway/outputs"
INSIDE_MODEL = "/gangway/model"
INSIDE_INPUTS = "/gangway/inputs"
INSIDE_RUN = "/gangway/run"
INSIDE_TMP = "/tmp"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RankInfo(_Frozen):
    rank: int
    world_size: int
    local_rank: int
    dp: int
    tp: int
    pp: int
    local_world_size: int = 1


class BuiltinRun(_Frozen):
    """The built-in trainer; `fields` are its TrainSpec and ParallelPlan fields (the
    trainer refuses a name it does not know)."""

    kind: Literal["builtin"] = "builtin"
    fields: dict[str, Any]


class FunctionRun(_Frozen):
    kind: Literal["function"] = "function"
    target: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ScriptRun(_Frozen):
    """A Python script: a path inside the shipped working directory, or a host path."""

    kind: Literal["script"] = "script"
    path: str
    args: list[str] = Field(default_factory=list)


class CommandRun(_Frozen):
    kind: Literal["command"] = "command"
    argv: list[str]


Run = Annotated[BuiltinRun | FunctionRun | ScriptRun | CommandRun, Field(discriminator="kind")]


class SandboxMode(enum.StrEnum):
    """`required`: a rank that cannot be sandboxed fails, saying why (auth on);
    `preferred`: sandboxed where the host can, else a plain child process (the
    single-user embedded default on a host without bubblewrap); `off`: never."""

    REQUIRED = "required"
    PREFERRED = "preferred"
    OFF = "off"


class SandboxIdentity(_Frozen):
    """The unprivileged OS identity the rank program runs as, where the supervisor runs
    as root (otherwise the program keeps the supervisor's uid inside a user namespace)."""

    uid: int = 65534
    gid: int = 65534


class RankLimits(_Frozen):
    """Limits the admin sets on every rank program (`None`: not limited)."""

    open_files: int = 65536
    # Processes and threads: the rank's cgroup's pids.max, else RLIMIT_NPROC (per uid).
    processes: int | None = 4096
    file_bytes: int | None = None  # the largest file the program may write
    # The rank's cgroup's memory limit, else RLIMIT_AS (address space: breaks CUDA).
    memory_bytes: int | None = None
    unpacked_bytes: int = 1 << 30  # what a shipped working directory may unpack to
    unpacked_files: int = 20_000


class PackageRef(_Frozen):
    """A shipped working directory, named by its zip's sha256. The zip's bytes reach the
    node through Ray's object store (the service puts them, the supervisor fetches them
    only where its node has not unpacked them yet): no node reads the service's disk."""

    sha256: str


class JobLaunch(_Frozen):
    """Everything a rank supervisor needs for one attempt of a job, whatever its rank."""

    job_id: int
    attempt: int
    user: str
    run: Run
    env: dict[str, str] = Field(default_factory=dict)  # the job's variables and secrets
    package: PackageRef | None = None
    requirements: list[str] = Field(default_factory=list)
    checkpoint_dir: str | None = None  # host path, the same on every attempt
    # or, on hosts that share no disk: the job's checkpoints in a store named by a URL
    # (workers.checkpoint_store), read and written by the supervisors alone
    checkpoint_url: str | None = None
    keep_last: int = 2
    outputs_dir: str | None = None  # host path of the job's collected outputs
    outputs_url: str | None = None  # or their URL in a store (hosts that share no disk)
    outputs_max_bytes: int = 0  # what this attempt may still add to them
    model_dir: str | None = None  # host path of the model version it starts from (read-only)
    # or, in the store: the URL of the job whose checkpoint it starts from, and the step
    # (None: its newest complete one)
    model_checkpoints: str | None = None
    model_url: str | None = None  # or the model version's files in a store
    model_step: int | None = None
    input_dirs: dict[str, str] = Field(default_factory=dict)  # name -> other jobs' outputs
    input_urls: dict[str, str] = Field(default_factory=dict)  # the same, in a store
    host_paths: list[str] = Field(default_factory=list)  # read-only: data files, host scripts
    sandbox: SandboxMode = SandboxMode.PREFERRED
    identity: SandboxIdentity = SandboxIdentity()
    limits: RankLimits = RankLimits()
    stop_grace_s: float = 120.0
    faults: str | None = None  # tests only: GANGWAY_FAULTS for the program


class ProgramLaunch(_Frozen):
    """The rank program's part: what to run, where its directories are inside the
    sandbox, its environment (the job's variables among it) and its limits. Written by
    the supervisor, read by `workers.program`, which applies `limits` and `env` before
    anything of the job's runs."""

    info: RankInfo
    run: Run
    work_dir: str | None = None
    checkpoint_dir: str | None = None
    own_checkpoint_dir: bool = False  # the rank's alone, synced by its supervisor
    outputs_dir: str = INSIDE_OUTPUTS
    model_dir: str | None = None
    keep_last: int = 2
    env: dict[str, str] = Field(default_factory=dict)
    limits: RankLimits = RankLimits()
