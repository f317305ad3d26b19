"""The executor: turns admitted jobs into worker groups on Ray, and reports on them.

It keeps only handles; everything it needs to rebuild them lives in the store (placement,
attempt, spec), which is why `attach` can find a group again after a service restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from scheduler.runtime.views import gang_shape
from scheduler.store import JobRecord
from workers.checkpoint_layout import job_directory
from workers.group import GroupSpec, GroupStatus, WorkerGroup, reap


class Executor(Protocol):
    def launch(self, job: JobRecord) -> None: ...
    def attach(self, job: JobRecord) -> bool: ...
    def stop(self, job_id: int) -> None: ...
    def poll(self) -> dict[int, GroupStatus]: ...
    def release(self, job_id: int) -> None: ...
    def job_ids(self) -> set[int]: ...
    def stacks(self, job_id: int) -> str: ...
    def reap(self, job: JobRecord) -> None: ...


def rank_entrypoint(job: JobRecord, checkpoint_root: Path | None) -> dict[str, Any]:
    """The entrypoint the ranks run, plus what only the service knows: the job's
    checkpoint directory (the same on every attempt, so a requeued or restarted job
    resumes from its newest checkpoint) and policy; the built-in trainer also gets the
    FSDP switch."""
    entrypoint = dict(job.spec["entrypoint"])
    policy = job.spec.get("checkpoint") or {}
    if entrypoint.get("kind") == "builtin":
        entrypoint["fsdp"] = bool(job.spec["parallelism"].get("fsdp", False))
        entrypoint["checkpoint_interval_steps"] = policy.get("interval_steps")
    if checkpoint_root is not None:
        entrypoint["checkpoint_dir"] = str(job_directory(checkpoint_root, job.id))
        entrypoint["keep_last"] = policy.get("keep_last", 2)
    entrypoint["env"] = dict(job.spec.get("env") or {})
    entrypoint["shipped"] = bool(job.spec.get("package"))
    return entrypoint


def runtime_env(spec: dict[str, Any], packages_root: Path | None) -> dict[str, Any] | None:
    """Ray's per-actor runtime_env: the shipped working directory as a `file://` URI to its
    zip (Ray unpacks it once per node and caches it by URI; the name is the content hash,
    so a URI never changes meaning), and the pip requirements (a virtualenv per node and
    requirement set, on top of the node's packages)."""
    env: dict[str, Any] = {}
    package = spec.get("package")
    if package:
        if packages_root is None:
            raise ValueError("a job with a working directory needs the packages directory")
        env["working_dir"] = (packages_root / f"{package}.zip").resolve().as_uri()
    if spec.get("requirements"):
        env["pip"] = list(spec["requirements"])
    return env or None


def group_spec(
    job: JobRecord, checkpoint_root: Path | None = None, packages_root: Path | None = None
) -> GroupSpec:
    if job.placement is None:
        raise ValueError(f"job {job.id} has no placement")
    shape = gang_shape(job.spec, job.placement)  # an elastic job runs at its placed dp
    return GroupSpec(
        job_id=job.id,
        attempt=job.attempt,
        node_ids=job.placement,
        gpus_per_rank=shape.gpus_per_rank,
        cpus_per_rank=shape.cpus_per_rank,
        dp=shape.parallelism.dp,
        tp=shape.parallelism.tp,
        pp=shape.parallelism.pp,
        entrypoint=rank_entrypoint(job, checkpoint_root),
        runtime_env=runtime_env(job.spec, packages_root),
    )


class RayExecutor:
    def __init__(
        self,
        *,
        placement_timeout_s: float,
        checkpoint_root: Path | None = None,
        packages_root: Path | None = None,
    ) -> None:
        self._placement_timeout_s = placement_timeout_s
        self._checkpoint_root = checkpoint_root
        self._packages_root = packages_root
        self._groups: dict[int, WorkerGroup] = {}

    def launch(self, job: JobRecord) -> None:
        self.release(job.id)
        self._groups[job.id] = WorkerGroup.launch(
            group_spec(job, self._checkpoint_root, self._packages_root),
            placement_timeout_s=self._placement_timeout_s,
        )

    def attach(self, job: JobRecord) -> bool:
        group = (
            WorkerGroup.attach(group_spec(job, self._checkpoint_root, self._packages_root))
            if job.placement
            else None
        )
        if group is not None:
            self._groups[job.id] = group
        return group is not None

    def stop(self, job_id: int) -> None:
        """Ask the ranks to stop after their current step (preemption notice)."""
        group = self._groups.get(job_id)
        if group is not None:
            group.stop()

    def poll(self) -> dict[int, GroupStatus]:
        return {job_id: group.poll() for job_id, group in self._groups.items()}

    def release(self, job_id: int) -> None:
        group = self._groups.pop(job_id, None)
        if group is not None:
            group.teardown()

    def job_ids(self) -> set[int]:
        return set(self._groups)

    def stacks(self, job_id: int) -> str:
        group = self._groups.get(job_id)
        return group.stacks() if group is not None else "(no live ranks)"

    def reap(self, job: JobRecord) -> None:
        """Tear down what Ray runs for the job's current attempt, without attaching."""
        self.release(job.id)
        reap(job.id, job.attempt)
