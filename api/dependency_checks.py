"""What a submit may name as the jobs it waits for (`depends_on`), starts from
(`init_from: {job}`) and reads the outputs of (`inputs_from`).

A plain user's job may wait only for that user's own jobs, and start only from their own
checkpoints (a checkpoint is its owner's weights; a dependency on a stranger's job would
let one user's cancel decide another's work); admins may name any. A job that does not
exist and one that cannot satisfy the condition any more (it FAILED and the job waits for
its success) are 422s naming the field. Upstream jobs exist before the job that names
them, so the graph has no cycle; a pipeline's steps name only earlier steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api.auth import Principal
from api.errors import FieldError
from gangway.models import JobSubmit
from scheduler.core.dependencies import Holds, Upstream, holds
from scheduler.model import Condition
from scheduler.store import JobNotFound, JobRecord, JobRepository
from scheduler.store.records import Step


def checked_dependencies(
    submit: JobSubmit, caller: Principal, repo: JobRepository, steps: Mapping[str, int] | None
) -> tuple[tuple[int | Step, Condition], ...]:
    """The (upstream job, condition) pairs the job waits for, each checked: the jobs named
    in `depends_on`, and the jobs whose checkpoint `init_from` or outputs `inputs_from`
    names (their success, unless `depends_on` names them with another condition).
    `steps`: in a pipeline, the earlier steps by name (their place in it), which may be
    named instead of a job id; None outside one."""
    naming = _Naming(submit, caller, repo, steps)
    pairs: dict[int | Step, Condition] = {}
    for named in submit.named_upstream():
        condition = Condition(named.on)
        upstream = naming.upstream(named.job, condition, named.field)
        kept = pairs.setdefault(upstream, condition)
        if named.source == "inputs_from" and kept is not condition:
            raise FieldError(
                named.field,
                f"job {named.job} is in depends_on with on: {kept.value}; its outputs "
                "are read once it succeeded (whole), so name it in one place",
            )
    return tuple(pairs.items())


@dataclass(frozen=True)
class _Naming:
    """What a job may name as upstream: its owner's jobs, or earlier steps."""

    submit: JobSubmit
    caller: Principal
    repo: JobRepository
    steps: Mapping[str, int] | None  # None: not in a pipeline

    def upstream(self, job: int | str, condition: Condition, field: str) -> int | Step:
        """The job named, checked: the owner's, and able to satisfy `condition`."""
        if isinstance(job, str):
            if self.steps is None:
                raise FieldError(field, f"{job!r} names a pipeline step; name a job id")
            if job not in self.steps:
                raise FieldError(field, f"{job!r} is not an earlier step of the pipeline")
            return Step(self.steps[job])
        record = self._owned(job, field)
        _possible(record, condition, field)
        return record.id

    def _owned(self, job: int, field: str) -> JobRecord:
        try:
            record = self.repo.get(job)
        except JobNotFound as exc:
            raise FieldError(field, f"no job {job}") from exc
        owner = self.submit.user
        if record.user != owner and not self.caller.is_admin:
            raise FieldError(
                field, f"job {job} is not {owner}'s: a job may name only its owner's jobs"
            )
        return record


def _possible(upstream: JobRecord, condition: Condition, field: str) -> None:
    """Refuse a condition that can never hold now (the job would only be cancelled)."""
    view = Upstream(upstream.id, condition, upstream.state, upstream.started_at is not None)
    if holds(view) is Holds.NEVER:
        raise FieldError(
            field,
            f"job {upstream.id} already ended {upstream.state.value}: "
            f"the condition {condition.value!r} can never hold",
        )
