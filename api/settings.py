"""Service settings, from `GANGWAY_*` environment variables; built in `main`, not at import."""

from __future__ import annotations

import os
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.convert import queue_quota
from api.limits import Limits
from gangway.models import QueueSpec
from scheduler.core import PolicyConfig, fairshare
from scheduler.model import QueueQuota
from scheduler.runtime import stragglers
from scheduler.runtime.gangs.status import TROUBLE_GRACE_S
from scheduler.runtime.launch import LaunchPolicy
from scheduler.runtime.leadership import SWEEP_EVERY_PASSES
from scheduler.runtime.lease import DEFAULT_TTL_S
from scheduler.runtime.lifecycle import LifecycleConfig
from scheduler.store.artifact_retention import DEFAULT_AGE, ArtifactRetention
from scheduler.store.output_stores import LocalOutputs, OutputsStorage
from scheduler.store.output_usage import DEFAULT_QUOTA_BYTES
from scheduler.store.outputs import job_outputs_dir
from scheduler.store.remote_models import RemoteModelFiles
from scheduler.store.remote_outputs import RemoteOutputs
from scheduler.store.retention import Retention
from workers.checkpoint_layout import job_directory
from workers.checkpoint_store import CheckpointStore
from workers.launch import RankLimits, SandboxIdentity, SandboxMode

_POLICY = PolicyConfig()  # the policy defaults the settings below start from
_LIFECYCLE = LifecycleConfig()  # and the hang rule's, the limits' and retention's
_LIMITS = Limits()
_RETENTION = Retention()


class QueueSettings(QueueSpec):
    """A queue in `GANGWAY_QUEUES`: the API's QueueSpec, its fields and bounds, checked as
    settings are (lax: "4" is 4)."""

    model_config = ConfigDict(extra="forbid", strict=False)


# Settings that were renamed: old -> new (one quota covers outputs and model versions).
_STORAGE_QUOTA = "GANGWAY_STORAGE_QUOTA_BYTES (a user's job outputs and model versions together)"
_STORAGE_URL = (
    "GANGWAY_STORAGE_URL; checkpoints now live under <url>/checkpoints/job-<id>, not "
    "<old url>/job-<id>: set it so that <url>/checkpoints is the old URL, or move them, or "
    "running jobs restart from scratch"
)
RENAMED = {
    "GANGWAY_CHECKPOINT_URL": _STORAGE_URL,
    "GANGWAY_OUTPUTS_QUOTA_BYTES": _STORAGE_QUOTA,
    "GANGWAY_MODELS_QUOTA_BYTES": _STORAGE_QUOTA,
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GANGWAY_", extra="ignore")

    data_dir: Path = Field(Path("~/.gangway"), description="SQLite file and logs live here")
    storage_dir: Path | None = Field(
        None,
        description="checkpoints, outputs and model files: storage every Ray node mounts "
        "(a shared mount on more than one host); empty = data_dir",
    )
    storage_url: str = Field(
        "",
        description="checkpoints, outputs and model versions in storage named by a URL "
        "(s3://bucket/prefix: hosts that share no disk), under <url>/checkpoints, "
        "<url>/outputs and <url>/models; the rank supervisors and the service read it with "
        "their own credentials (AWS_* variables), the jobs never; empty = storage_dir",
    )
    database_url: str = Field("", description="SQLAlchemy URL; empty = SQLite in data_dir")
    ray_address: str = Field("", description="Ray cluster to join; empty = start a local one")
    ray_node_ip: str = Field(
        "",
        description="with ray_address: the address of this host's Ray node, which the service "
        "drives Ray from (a host with several); empty = the one Ray finds on this host",
    )
    local_nodes: int = Field(2, ge=1, le=16, description="logical GPU nodes of the local Ray")
    local_gpus_per_node: int = Field(4, ge=1, le=16)
    local_cpus_per_node: int = Field(8, ge=1, le=256)
    auth: bool | None = Field(
        None,
        description="require API keys; unset: off only for the embedded default (no "
        "database_url), on with a database of your own",
    )
    admin_key: SecretStr | None = Field(
        None,
        min_length=16,
        description="bootstrap admin key (creates the first users); keep it secret",
    )
    host: str = "127.0.0.1"
    allow_remote_without_auth: bool = Field(
        False,
        description="with auth off, serve on a non-loopback address anyway (anyone who "
        "reaches it is an admin)",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="with auth off, Host names accepted besides loopback and the bind "
        "address (JSON list; names without ports: pages may change things only from the "
        "scheme and port the service is served on)",
    )
    allowed_entrypoints: dict[
        Literal["user", "admin"], list[Literal["builtin", "function", "script", "command"]]
    ] = Field(
        default_factory=dict,
        description='entrypoint kinds per role, JSON, e.g. {"user": ["builtin", "command"]}; '
        "a role left out may use every kind",
    )
    script_roots: list[Path] | None = Field(
        None,
        description="directories on the hosts that script paths of jobs without a shipped "
        "working directory must lie in; unset: anywhere with auth off, none with auth on",
    )
    function_modules: list[str] | None = Field(
        None,
        description="module prefixes a function target without a shipped working directory "
        "may name; unset: any with auth off, only workers.examples with auth on",
    )
    package_max_bytes: int = Field(
        95 * 1024 * 1024, ge=1, description="largest working directory a client may upload"
    )
    package_max_unpacked_bytes: int = Field(
        _LIMITS.package_max_unpacked_bytes,
        ge=1,
        description="an uploaded working directory's zip may declare at most this many "
        "bytes unpacked (its entries' sizes added up; 413 above): every node that runs "
        "the job unpacks it",
    )
    package_max_files: int = Field(
        _LIMITS.package_max_files,
        ge=1,
        description="an uploaded working directory's zip may hold at most this many "
        "entries (413 above)",
    )
    package_grace_s: float = Field(
        3600.0, gt=0, description="an unreferenced package is deleted after this long unused"
    )
    sandbox: Literal["auto", "required", "preferred", "off"] = Field(
        "auto",
        description="rank programs run in a bubblewrap sandbox: required (a node that cannot "
        "fails the rank), preferred (unsandboxed where the node cannot), off; auto: required "
        "with auth on, preferred without",
    )
    sandbox_uid: int = Field(65534, ge=1, description="uid of rank programs (root services)")
    sandbox_gid: int = Field(65534, ge=1, description="gid of rank programs (root services)")
    sandbox_user_ids: dict[str, tuple[int, int]] = Field(
        default_factory=dict,
        description='per-user [uid, gid] of rank programs, JSON, e.g. {"alice": [2001, 2001]}',
    )
    rank_open_files: int = Field(65536, ge=64, description="RLIMIT_NOFILE of a rank program")
    rank_processes: int | None = Field(
        4096,
        ge=16,
        description="processes and threads of a rank program: its cgroup's pids.max where "
        "the node lets the supervisor make one, else RLIMIT_NPROC (counted per uid)",
    )
    rank_file_bytes: int | None = Field(
        None, ge=1, description="largest file a rank program may write (RLIMIT_FSIZE)"
    )
    rank_memory_bytes: int | None = Field(
        None,
        ge=1 << 26,
        description="memory of a rank program: its cgroup's limit (the OOM killer ends the "
        "rank), else RLIMIT_AS (address space: not with CUDA)",
    )
    requirements_allow_pip_options: bool = Field(
        False,
        description="take requirement lines as pip reads them (options such as -e, -r or "
        "--index-url, URLs, paths); off: only 'name[extras] specifier ; marker' lines, "
        "others are a 422 naming requirements.N",
    )
    port: int = Field(8000, ge=0, le=65535)
    schedule_interval_s: float = Field(1.0, gt=0, le=60)
    lease_ttl_s: float = Field(
        DEFAULT_TTL_S,
        gt=0,
        description="a standby takes over this long after the leader's last renewal (the "
        "leader renews every third of it; no Ray call of a pass waits longer than a third)",
    )
    sweep_every_passes: int = Field(
        SWEEP_EVERY_PASSES,
        ge=1,
        description="reap Gangway gangs on Ray that no active job owns, this often",
    )
    busy_interval_s: float = Field(
        0.1, gt=0, le=60, description="between passes while a gang starts, stops or resizes"
    )
    auto_calibrate: bool | None = Field(
        None,
        description="measure a node type nothing has measured yet with a few short, "
        "lowest-priority built-in runs of user gangway (scheduler.runtime.calibration); "
        "unset: on with a Ray cluster of its own (ray_address), off for the embedded one, "
        "whose logical GPUs share this host's cores with users' jobs",
    )
    placement_timeout_s: float = Field(120.0, gt=0)
    ray_trouble_grace_s: float = Field(
        TROUBLE_GRACE_S,
        gt=0,
        description="a running gang fails when Ray cannot answer for it this long: a "
        "control-plane error that lasts, or a rank whose status call goes unanswered "
        "(its supervisor stuck, its node unreachable but not yet dead)",
    )
    hang_factor: float = Field(
        _LIFECYCLE.hang_factor, gt=1, description="x recent step time without progress"
    )
    hang_min_s: float = Field(
        _LIFECYCLE.hang_min_s, gt=0, description="never call a job hung sooner"
    )
    start_timeout_s: float = Field(
        _LIFECYCLE.start_timeout_s,
        gt=0,
        description="a gang not started this long after admission, or a built-in trainer "
        "with no step this long after its ranks started, is hung (stacks kept, restarted "
        "within max_restarts)",
    )
    straggler_factor: float = Field(
        stragglers.DEFAULT_FACTOR,
        gt=1,
        description="a rank this many times slower than the gang's median is flagged",
    )
    straggler_window: int = Field(
        stragglers.DEFAULT_WINDOW, ge=3, description="polls with progress a flag looks at"
    )
    # Limits and retention (see README "Limits").
    max_body_bytes: int = Field(
        _LIMITS.max_body_bytes,
        ge=1024,
        description="larger request bodies get a 413 (uploads exempt)",
    )
    max_json_depth: int = Field(
        _LIMITS.max_json_depth,
        ge=8,
        le=200,
        description="JSON bodies nested deeper (arrays and objects) get a 422; at most 200, "
        "well inside the nesting json.loads and pydantic can take",
    )
    max_page_bytes: int = Field(
        _LIMITS.max_page_bytes, ge=64 * 1024, description="a job listing ends its page at this size"
    )
    streams_per_caller: int = Field(
        _LIMITS.streams_per_caller,
        ge=1,
        le=1000,
        description="concurrent log streams per API key (or client address)",
    )
    stream_poll_s: float = Field(
        _LIMITS.stream_poll_s, ge=0.1, le=60, description="a log stream checks for lines"
    )
    log_lines_per_job: int = Field(
        _RETENTION.log_lines_per_job,
        ge=100,
        description="older lines of a job are deleted past this many",
    )
    reported_points_per_job: int = Field(
        _RETENTION.reported_points_per_job,
        ge=1000,
        description="older metric points a job reported are deleted past this many",
    )
    telemetry_retention_days: float = Field(
        _RETENTION.telemetry_age / timedelta(days=1),
        gt=0,
        description="metric points older than this, and logs of jobs ended longer ago, are deleted",
    )
    retention_interval_s: float = Field(600.0, gt=0, description="between retention sweeps")
    storage_quota_bytes: int = Field(
        DEFAULT_QUOTA_BYTES,
        ge=0,
        description="bytes one user's job outputs and model versions may hold together",
    )
    artifact_retention_days: float = Field(
        DEFAULT_AGE / timedelta(days=1),
        gt=0,
        description="outputs and checkpoints of jobs that ended longer ago are deleted, and "
        "model versions registered longer ago that no alias names, not their model's newest "
        "and that no unfinished job or running sweep starts from",
    )
    # Scheduling policy: the defaults are PolicyConfig's (scheduler.core.config, which says
    # what each one bounds).
    aging_interval_s: float = Field(_POLICY.aging_interval_s, gt=0)
    min_runtime_s: float = Field(_POLICY.min_runtime_s, ge=0)
    checkpoint_grace_s: float = Field(_POLICY.checkpoint_grace_s, ge=0)
    # A resized or resumed run's warm-up: a grow must win back more than this plus the grace.
    restart_cost_s: float = Field(_POLICY.restart_cost_s, ge=0)
    default_runtime_s: float = Field(_POLICY.default_runtime_s, gt=0)
    backfill: bool = _POLICY.backfill
    preemption: bool = _POLICY.preemption
    reservations: bool = Field(
        _POLICY.reservations,
        description="hold GPUs for the first job that cannot start (EASY backfill); off: "
        "greedy backfill, blocked jobs make room by preemption",
    )
    service_levels_gpu_s: tuple[float, ...] = Field(
        _POLICY.service_levels_gpu_s,
        description="least-attained-service levels, JSON list of ascending GPU-seconds; [] off",
    )
    starvation_s: float = Field(_POLICY.starvation_s, gt=0)
    protect_after_runs: float = Field(_POLICY.protect_after_runs, ge=0)
    age_per_runs: float = Field(_POLICY.age_per_runs, ge=0)
    service_preemption_loss_s: float = Field(_POLICY.service_preemption_loss_s, ge=0)
    larger_gangs_first: bool = Field(
        _POLICY.larger_gangs_first,
        description="within a service band, a gang that needs more GPUs (elastic: at its "
        "minimum; counted up to the largest node) is queued first",
    )
    smaller_victims_first: bool = Field(
        _POLICY.smaller_victims_first,
        description="among preemption victims of one rank, a gang that needs fewer GPUs "
        "(elastic: at its minimum; counted up to the largest node) is stopped first",
    )
    fair_share_half_life_s: float = Field(fairshare.HALF_LIFE_S, gt=0)
    queues: dict[str, QueueSettings] = Field(
        default_factory=dict,
        description='JSON, e.g. {"research": {"guaranteed_gpus": 4, "borrow_limit_gpus": 4}}',
    )

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_setting(cls, values: object) -> object:
        """A setting that was renamed would otherwise be ignored, and its value lost
        without a word (unknown GANGWAY_ variables are ignored)."""
        for old, new in RENAMED.items():
            if old in os.environ:
                raise ValueError(f"{old} is gone: set {new}")
        return values

    @model_validator(mode="after")
    def _policy_is_valid(self) -> Settings:
        self.policy()  # PolicyConfig's own checks (e.g. levels ascending) name the field
        return self

    def calibrates(self) -> bool:
        """Whether the loop queues calibration runs on its own (`auto_calibrate`)."""
        return self.auto_calibrate if self.auto_calibrate is not None else bool(self.ray_address)

    def storage(self) -> Path:
        """What ranks and the service both read and write (checkpoints, outputs, model
        files): `storage_dir`, else the data dir; on more than one host, a shared mount.
        Nothing else of the data dir (database, packages) need be seen by a node."""
        return (self.storage_dir or self.data_dir).expanduser()

    def checkpoint_root(self) -> Path:
        """Where ranks write checkpoints: shared storage when ranks run on other hosts."""
        return self.storage() / "checkpoints"

    def _under_storage_url(self, part: str) -> str | None:
        """`<storage_url>/<part>` when `storage_url` names a store, else None."""
        return f"{self.storage_url.rstrip('/')}/{part}" if self.storage_url else None

    def checkpoint_url(self) -> str | None:
        """Where checkpoints live when `storage_url` names a store."""
        return self._under_storage_url("checkpoints")

    def checkpoint_store(self) -> CheckpointStore | None:
        url = self.checkpoint_url()
        return CheckpointStore(url) if url else None

    def outputs_url(self) -> str | None:
        """Where jobs' outputs live when `storage_url` names a store."""
        return self._under_storage_url("outputs")

    def outputs_store(self) -> RemoteOutputs | None:
        url = self.outputs_url()
        return RemoteOutputs(url) if url else None

    def models_url(self) -> str | None:
        """Where model versions' files live when `storage_url` names a store."""
        return self._under_storage_url("models")

    def model_store(self) -> RemoteModelFiles | None:
        url = self.models_url()
        return RemoteModelFiles(url) if url else None

    def outputs_storage(self) -> OutputsStorage:
        """Jobs' outputs, wherever they are: the store, else the folder."""
        return self.outputs_store() or LocalOutputs(self.outputs_root())

    def models_root(self) -> Path:
        """The registered model versions' files (`scheduler.store.model_files`)."""
        return self.storage() / "models"

    def outputs_root(self) -> Path:
        """What jobs' ranks wrote to their OUTPUTS_DIR, copied by the rank supervisors
        (`scheduler.store.outputs`): shared storage when ranks run on other hosts."""
        return self.storage() / "outputs"

    def sandbox_mode(self) -> SandboxMode:
        if self.sandbox != "auto":
            return SandboxMode(self.sandbox)
        return SandboxMode.REQUIRED if self.auth_required() else SandboxMode.PREFERRED

    def launch_policy(self) -> LaunchPolicy:
        """What every rank of every job is launched with (scheduler.runtime.launch)."""
        return LaunchPolicy(
            checkpoint_root=self.checkpoint_root(),
            checkpoint_url=self.checkpoint_url(),
            outputs_url=self.outputs_url(),
            models_url=self.models_url(),
            packages_root=self.packages_root(),
            outputs_root=self.outputs_root(),
            models_root=self.models_root(),
            sandbox=self.sandbox_mode(),
            default_identity=SandboxIdentity(uid=self.sandbox_uid, gid=self.sandbox_gid),
            user_identities={
                user: SandboxIdentity(uid=uid, gid=gid)
                for user, (uid, gid) in self.sandbox_user_ids.items()
            },
            limits=RankLimits(
                open_files=self.rank_open_files,
                processes=self.rank_processes,
                file_bytes=self.rank_file_bytes,
                memory_bytes=self.rank_memory_bytes,
                unpacked_bytes=self.package_max_unpacked_bytes,
                unpacked_files=self.package_max_files,
            ),
            stop_grace_s=self.checkpoint_grace_s,
        )

    def artifact_retention(self) -> ArtifactRetention:
        """Ended jobs' outputs and checkpoint directories, kept this long (model versions
        too, by `scheduler.store.model_retention`'s rule)."""
        return ArtifactRetention(
            folders=(
                partial(job_outputs_dir, self.outputs_root()),
                partial(job_directory, self.checkpoint_root()),
            ),
            age=timedelta(days=self.artifact_retention_days),
            stores=tuple(
                store.job
                for store in (self.checkpoint_store(), self.outputs_store())
                if store is not None
            ),
        )

    def packages_root(self) -> Path:
        """Uploaded working directories, read by the service alone: a gang's nodes get
        the zip through Ray's object store (`scheduler.runtime.gangs.group`)."""
        return self.data_dir.expanduser() / "packages"

    def limits(self) -> Limits:
        """Everything the app bounds a caller by, the package and requirement rules too:
        the app factory takes them as one value."""
        return Limits(
            max_body_bytes=self.max_body_bytes,
            max_json_depth=self.max_json_depth,
            max_page_bytes=self.max_page_bytes,
            streams_per_caller=self.streams_per_caller,
            stream_poll_s=self.stream_poll_s,
            package_max_unpacked_bytes=self.package_max_unpacked_bytes,
            package_max_files=self.package_max_files,
            requirements_allow_pip_options=self.requirements_allow_pip_options,
        )

    def retention(self) -> Retention:
        return Retention(
            log_lines_per_job=self.log_lines_per_job,
            reported_points_per_job=self.reported_points_per_job,
            telemetry_age=timedelta(days=self.telemetry_retention_days),
        )

    def quotas(self) -> dict[str, QueueQuota]:
        return {name: queue_quota(spec) for name, spec in self.queues.items()}

    def lifecycle(self) -> LifecycleConfig:
        """The hang rule and the start timeout the loop judges running gangs by."""
        return LifecycleConfig(
            hang_factor=self.hang_factor,
            hang_min_s=self.hang_min_s,
            start_timeout_s=self.start_timeout_s,
        )

    def policy(self) -> PolicyConfig:
        return PolicyConfig(
            aging_interval_s=self.aging_interval_s,
            min_runtime_s=self.min_runtime_s,
            checkpoint_grace_s=self.checkpoint_grace_s,
            restart_cost_s=self.restart_cost_s,
            default_runtime_s=self.default_runtime_s,
            backfill=self.backfill,
            preemption=self.preemption,
            reservations=self.reservations,
            service_levels_gpu_s=self.service_levels_gpu_s,
            starvation_s=self.starvation_s,
            protect_after_runs=self.protect_after_runs,
            age_per_runs=self.age_per_runs,
            service_preemption_loss_s=self.service_preemption_loss_s,
            larger_gangs_first=self.larger_gangs_first,
            smaller_victims_first=self.smaller_victims_first,
        )

    def auth_required(self) -> bool:
        """Auth is off by default only for the single-user embedded service."""
        return self.auth if self.auth is not None else bool(self.database_url)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir.expanduser() / 'gangway.db'}"
