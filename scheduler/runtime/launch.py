"""What the ranks receive: the one function that turns a job's spec into its `JobLaunch`.

Submit-time validation calls `builtin_fields` too (api/validation.py), so what is checked
is what runs. No Ray or torch here: the API imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.model import (
    BuiltinEntrypoint,
    CheckpointInit,
    CommandEntrypoint,
    FunctionEntrypoint,
    JobSpec,
    ModelInit,
    ScriptEntrypoint,
)
from scheduler.store.model_files import version_directory
from scheduler.store.outputs import job_outputs_dir
from scheduler.store.remote_models import model_version_url
from scheduler.store.remote_outputs import job_outputs_url
from workers import faults
from workers.checkpoint_layout import checkpoint_path, completed, job_directory
from workers.checkpoint_store import CheckpointStore
from workers.launch import (
    BuiltinRun,
    CommandRun,
    FunctionRun,
    JobLaunch,
    PackageRef,
    RankLimits,
    Run,
    SandboxIdentity,
    SandboxMode,
    ScriptRun,
)


@dataclass(frozen=True)
class LaunchPolicy:
    """What the service decides for every rank, whoever's: where the job's files live,
    whether a sandbox is required, which uid a user's programs run as, the limits, the
    stop grace, and how many output bytes a user may still add (`outputs_left`)."""

    checkpoint_root: Path | None = None
    checkpoint_url: str | None = None  # a store instead (hosts that share no disk)
    packages_root: Path | None = None
    outputs_root: Path | None = None
    outputs_url: str | None = None  # a store instead (hosts that share no disk)
    models_root: Path | None = None
    models_url: str | None = None  # a store instead (hosts that share no disk)
    sandbox: SandboxMode = SandboxMode.PREFERRED
    default_identity: SandboxIdentity = field(default_factory=SandboxIdentity)
    user_identities: Mapping[str, SandboxIdentity] = field(default_factory=dict)
    limits: RankLimits = field(default_factory=RankLimits)
    stop_grace_s: float = 120.0
    outputs_left: Callable[[str], int] = lambda _user: 0

    def identity(self, user: str) -> SandboxIdentity:
        return self.user_identities.get(user, self.default_identity)


def builtin_fields(spec: JobSpec) -> dict[str, Any]:
    """The built-in trainer's fields for this job: its entrypoint's settings plus what
    only the job spec knows (FSDP from `parallelism`, the checkpoint policy)."""
    entry = spec.entrypoint
    if not isinstance(entry, BuiltinEntrypoint):
        raise ValueError("not a built-in trainer job")
    return {
        **entry.settings,
        "fsdp": spec.fsdp,
        "checkpoint_interval_steps": spec.checkpoint.interval_steps,
        "keep_last": spec.checkpoint.keep_last,
    }


def job_launch(
    spec: JobSpec, *, job_id: int, attempt: int, user: str, policy: LaunchPolicy
) -> JobLaunch:
    """The launch every rank of this attempt gets: what to run, the job's variables and
    secrets, its code, its directories (the checkpoint directory is the same on every
    attempt, so a requeued or restarted job resumes from its newest checkpoint)."""
    code = spec.code
    package = PackageRef(sha256=code.package) if code.package is not None else None
    checkpoints = (
        str(job_directory(policy.checkpoint_root, job_id)) if policy.checkpoint_root else None
    )
    checkpoint_url = (
        CheckpointStore(policy.checkpoint_url).job_url(job_id) if policy.checkpoint_url else None
    )
    outputs_url = job_outputs_url(policy.outputs_url, job_id) if policy.outputs_url else None
    outputs = (
        str(job_outputs_dir(policy.outputs_root, job_id))
        if policy.outputs_root and not outputs_url
        else None
    )
    return JobLaunch(
        model_dir=_model_dir(spec, policy),
        model_url=_model_url(spec, policy),
        model_checkpoints=_model_checkpoints(spec, policy),
        model_step=spec.init_from.step if isinstance(spec.init_from, CheckpointInit) else None,
        input_dirs=_input_dirs(spec, policy) if not policy.outputs_url else {},
        input_urls=_input_urls(spec, policy.outputs_url) if policy.outputs_url else {},
        job_id=job_id,
        attempt=attempt,
        user=user,
        run=_run(spec),
        env={**code.env, **code.secrets},
        package=package,
        requirements=list(code.requirements),
        checkpoint_dir=None if checkpoint_url else checkpoints,
        checkpoint_url=checkpoint_url,
        keep_last=spec.checkpoint.keep_last,
        outputs_dir=outputs,
        outputs_url=outputs_url,
        outputs_max_bytes=policy.outputs_left(user) if outputs or outputs_url else 0,
        host_paths=_data_files(spec),
        sandbox=policy.sandbox,
        identity=policy.identity(user),
        limits=policy.limits,
        stop_grace_s=policy.stop_grace_s,
        faults=faults.passthrough().get(faults.ENV),
    )


def package_file(spec: JobSpec, policy: LaunchPolicy) -> Path | None:
    """Where the service keeps the job's shipped working directory (the zip it hands to
    Ray's object store at launch); None for a job without one."""
    if spec.code.package is None:
        return None
    if policy.packages_root is None:
        raise ValueError("a job with a working directory needs the packages directory")
    return (policy.packages_root / f"{spec.code.package}.zip").resolve()


def _model_dir(spec: JobSpec, policy: LaunchPolicy) -> str | None:
    """The weights the job starts from, mounted read-only: a model version's files, or
    another job's checkpoint (the one at the step it names, else its newest complete one
    now; where there is none, a path that does not exist, which the supervisor refuses
    with the reason)."""
    init = spec.init_from
    if init is None:
        return None
    if isinstance(init, CheckpointInit):
        if policy.checkpoint_url:
            return None  # in the store: `_model_checkpoints`
        if policy.checkpoint_root is None:
            raise ValueError("a job that starts from a checkpoint needs the checkpoint directory")
        directory = job_directory(policy.checkpoint_root, init.job_id)
        if init.step is not None:
            return str(checkpoint_path(directory, init.step))
        saved = completed(directory)
        return str(saved[-1] if saved else checkpoint_path(directory, 0))
    if policy.models_url:
        return None  # in the store: `_model_url`
    if policy.models_root is None:
        raise ValueError("a job that starts from a model version needs the models directory")
    return str(version_directory(policy.models_root, init.name, init.version))


def _model_url(spec: JobSpec, policy: LaunchPolicy) -> str | None:
    """The store URL of the model version the job starts from; its supervisors fetch it
    onto their hosts."""
    init = spec.init_from
    if not isinstance(init, ModelInit) or not policy.models_url:
        return None
    return model_version_url(policy.models_url, init.name, init.version)


def _model_checkpoints(spec: JobSpec, policy: LaunchPolicy) -> str | None:
    """The store URL of the job whose checkpoint this job starts from; its supervisors
    pick the step (the one `init_from` names, else the newest complete one): the loop
    never waits on the store."""
    init = spec.init_from
    if not isinstance(init, CheckpointInit) or not policy.checkpoint_url:
        return None
    return CheckpointStore(policy.checkpoint_url).job_url(init.job_id)


def _input_dirs(spec: JobSpec, policy: LaunchPolicy) -> dict[str, str]:
    """The outputs of the jobs it reads (`inputs_from`), by the folder name they get under
    INPUTS_DIR, mounted read-only."""
    if not spec.inputs_from:
        return {}
    if policy.outputs_root is None:
        raise ValueError("a job that reads other jobs' outputs needs the outputs directory")
    return {
        f"job-{job}": str(job_outputs_dir(policy.outputs_root, job)) for job in spec.inputs_from
    }


def _input_urls(spec: JobSpec, root_url: str) -> dict[str, str]:
    """The same, in storage named by a URL: each rank's supervisor fetches them onto its
    host before the start."""
    return {f"job-{job}": job_outputs_url(root_url, job) for job in spec.inputs_from}


def _run(spec: JobSpec) -> Run:
    entry = spec.entrypoint
    if isinstance(entry, BuiltinEntrypoint):
        fields = builtin_fields(spec)
        if fields.get("data_path"):  # read at this path in the sandbox
            fields["data_path"] = str(Path(str(fields["data_path"])).resolve())
        return BuiltinRun(fields=fields)
    if isinstance(entry, FunctionEntrypoint):
        return FunctionRun(target=entry.target, kwargs=dict(entry.kwargs))
    if isinstance(entry, ScriptEntrypoint):
        return ScriptRun(path=entry.path, args=list(entry.args))
    if isinstance(entry, CommandEntrypoint):
        return CommandRun(argv=list(entry.argv))
    raise TypeError(f"unknown entrypoint {entry!r}")


def _data_files(spec: JobSpec) -> list[str]:
    """Host files the built-in trainer reads (its token file), mounted read-only."""
    entry = spec.entrypoint
    if isinstance(entry, BuiltinEntrypoint) and entry.settings.get("data_path"):
        return [str(Path(str(entry.settings["data_path"])).resolve())]
    return []
