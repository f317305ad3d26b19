"""What a submit may name as the jobs it waits for (`depends_on`) and starts from
(`init_from: {job}`).

A plain user's job may wait only for that user's own jobs, and start only from their own
checkpoints (a checkpoint is its owner's weights; a dependency on a stranger's job would
let one user's cancel decide another's work); admins may name any. A job that does not
exist and one that cannot satisfy the condition any more (it FAILED and the job waits for
its success) are 422s naming the field. Upstream jobs exist before the job that names
them, so the graph has no cycle; a pipeline's steps name only earlier steps.
"""

from __future__ import annotations

from api.auth import Principal
from api.errors import FieldError
from gangway.models import CheckpointRef, JobSubmit
from scheduler.core.dependencies import Holds, Upstream, holds
from scheduler.model import Condition
from scheduler.store import JobNotFound, JobRecord, JobRepository


def checked_dependencies(
    submit: JobSubmit, caller: Principal, repo: JobRepository
) -> tuple[tuple[int, Condition], ...]:
    """The (upstream id, condition) pairs the job waits for, each checked: the jobs named
    in `depends_on`, and the job whose checkpoint `init_from` names (its success, unless
    `depends_on` names it with another condition)."""
    pairs: dict[int, Condition] = {}
    for index, dep in enumerate(submit.depends_on):
        field = f"depends_on.{index}.job"
        upstream = _upstream(dep.job, field, submit, caller, repo)
        condition = Condition(dep.on)
        _possible(upstream, condition, field)
        pairs[upstream.id] = condition
    init = submit.init_from
    if isinstance(init, CheckpointRef):
        upstream = _upstream(init.job, "init_from.job", submit, caller, repo)
        if upstream.id not in pairs:
            _possible(upstream, Condition.SUCCEEDED, "init_from.job")
            pairs[upstream.id] = Condition.SUCCEEDED
    return tuple(pairs.items())


def _upstream(
    job: int | str, field: str, submit: JobSubmit, caller: Principal, repo: JobRepository
) -> JobRecord:
    if isinstance(job, str):
        raise FieldError(field, f"{job!r} names a pipeline step; outside a pipeline name a job id")
    try:
        record = repo.get(job)
    except JobNotFound as exc:
        raise FieldError(field, f"no job {job}") from exc
    if record.user != submit.user and not caller.is_admin:
        raise FieldError(
            field, f"job {job} is not {submit.user}'s: a job may name only its owner's jobs"
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
