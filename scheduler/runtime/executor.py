"""The executor: turns admitted jobs into worker groups on Ray, and reports on them.

It keeps only handles; everything it needs to rebuild them lives in the store (placement,
attempt, spec), which is why `attach` can find a group again after a service restart,
and why `sweep` can find what no handle points at: Ray's objects are named per (job,
attempt).
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Protocol

from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup, attempts_on_ray, reap
from scheduler.runtime.gangs.status import TROUBLE_GRACE_S, GroupStatus
from scheduler.runtime.launch import LaunchPolicy, job_launch, package_file
from scheduler.store import JobRecord


class Executor(Protocol):
    def launch(self, job: JobRecord) -> None: ...
    def attach(self, job: JobRecord) -> bool: ...
    def stop(self, job_id: int) -> None: ...
    def poll(self) -> dict[int, GroupStatus]: ...
    def release(self, job_id: int) -> None: ...
    def job_ids(self) -> set[int]: ...
    def stacks(self, job_id: int) -> str: ...
    def reap(self, job: JobRecord) -> None: ...
    def sweep(self, active: Set[tuple[int, int]]) -> list[tuple[int, int]]: ...
    def forget(self) -> None: ...


def group_spec(job: JobRecord, policy: LaunchPolicy | None = None) -> GroupSpec:
    """The gang of the job's current attempt, as its placement and spec say."""
    if job.placement is None:
        raise ValueError(f"job {job.id} has no placement")
    shape = job.spec.placed(job.placement)  # an elastic job runs at its placed dp
    policy = policy or LaunchPolicy()
    return GroupSpec(
        node_ids=job.placement,
        gpus_per_rank=shape.gpus_per_rank,
        cpus_per_rank=shape.cpus_per_rank,
        dp=shape.parallelism.dp,
        tp=shape.parallelism.tp,
        pp=shape.parallelism.pp,
        launch=job_launch(
            job.spec,
            job_id=job.id,
            attempt=job.attempt,
            user=job.user,
            policy=policy,
        ),
        package_file=package_file(job.spec, policy),
    )


class RayExecutor:
    def __init__(
        self,
        *,
        placement_timeout_s: float,
        policy: LaunchPolicy | None = None,
        call_timeout_s: float = 5.0,
        trouble_grace_s: float = TROUBLE_GRACE_S,
    ) -> None:
        self._placement_timeout_s = placement_timeout_s
        self._policy = policy or LaunchPolicy()
        self._call_timeout_s = call_timeout_s  # bound on any one blocking Ray call
        # how long Ray may fail to answer for a gang before the gang fails
        self._trouble_grace_s = trouble_grace_s
        self._groups: dict[int, WorkerGroup] = {}

    def launch(self, job: JobRecord) -> None:
        self.release(job.id)
        self._groups[job.id] = WorkerGroup.launch(
            group_spec(job, self._policy),
            placement_timeout_s=self._placement_timeout_s,
            call_timeout_s=self._call_timeout_s,
            trouble_grace_s=self._trouble_grace_s,
        )

    def attach(self, job: JobRecord) -> bool:
        group = (
            WorkerGroup.attach(
                group_spec(job, self._policy),
                call_timeout_s=self._call_timeout_s,
                trouble_grace_s=self._trouble_grace_s,
            )
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

    def sweep(self, active: Set[tuple[int, int]]) -> list[tuple[int, int]]:
        """Tear down every Gangway placement group and rank actor on Ray whose (job,
        attempt) is not in `active`, handle or not; the attempts reaped."""
        orphans = sorted(attempts_on_ray() - set(active))
        for job_id, attempt in orphans:
            group = self._groups.get(job_id)
            if group is not None and group.spec.attempt == attempt:
                self.release(job_id)
            reap(job_id, attempt)
        return orphans

    def forget(self) -> None:
        """Drop every handle without touching Ray: the gangs now belong to another
        leader, which reattaches them."""
        self._groups.clear()


class GuardedExecutor:
    """An executor whose every Ray action first passes `guard` (the leader's fence check,
    which raises `Fenced` for a leader that lost its lease). Bookkeeping without Ray
    (`job_ids`, `forget`) is not guarded."""

    def __init__(self, inner: Executor, guard: Callable[[], None]) -> None:
        self._inner = inner
        self._guard = guard

    def launch(self, job: JobRecord) -> None:
        self._guard()
        self._inner.launch(job)

    def attach(self, job: JobRecord) -> bool:
        self._guard()
        return self._inner.attach(job)

    def stop(self, job_id: int) -> None:
        self._guard()
        self._inner.stop(job_id)

    def poll(self) -> dict[int, GroupStatus]:
        self._guard()  # a poll creates the rank actors of a group whose placement is ready
        return self._inner.poll()

    def release(self, job_id: int) -> None:
        self._guard()
        self._inner.release(job_id)

    def job_ids(self) -> set[int]:
        return self._inner.job_ids()

    def stacks(self, job_id: int) -> str:
        self._guard()
        return self._inner.stacks(job_id)

    def reap(self, job: JobRecord) -> None:
        self._guard()
        self._inner.reap(job)

    def sweep(self, active: Set[tuple[int, int]]) -> list[tuple[int, int]]:
        self._guard()
        return self._inner.sweep(active)

    def forget(self) -> None:
        self._inner.forget()
