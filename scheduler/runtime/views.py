"""Store records -> the core's domain views."""

from __future__ import annotations

from scheduler.model import JobView, Placement, RunInfo
from scheduler.store import JobRecord


def job_view(record: JobRecord) -> JobView:
    return JobView(
        id=record.id,
        priority=record.priority,
        submitted_at=record.submitted_at,
        state=record.state,
        shape=record.spec.placed(record.placement),
        placement=Placement(record.placement) if record.placement else None,
        preemptible=record.spec.preemptible,
        time_limit_s=record.spec.time_limit_s,
        run=run_info(record),
        queue=record.queue,
        user=record.user,
        attained_gpu_s=record.attained_gpu_s,
        queued_at=record.queued_at,
        hold=record.hold,
    )


def run_info(record: JobRecord) -> RunInfo | None:
    """Measured progress of a job holding resources. Step time: what rank 0 measured of
    its latest step, else `mean_step_time_s`. A preemption loses the steps since the
    newest checkpoint the attempt reported (a resumed attempt reports the one it
    loaded); with none reported, every step done."""
    started = record.started_at or record.admitted_at
    if record.placement is None or started is None:
        return None
    step_time_s = record.step_time_s
    if step_time_s is None:
        step_time_s = mean_step_time_s(record)
    saved = record.checkpoint_step
    return RunInfo(
        started_at=started,
        step=record.step,
        total_steps=record.total_steps,
        step_time_s=step_time_s,
        steps_since_checkpoint=max(0, record.step - saved) if saved is not None else record.step,
    )


def mean_step_time_s(record: JobRecord) -> float | None:
    """Seconds from the attempt's start to its latest step, over the step number: start-up
    and slow steps (evaluation, saving) included, which the hang rule needs; for a resumed
    attempt short of the truth (its step counts the steps before it too)."""
    started = record.started_at or record.admitted_at
    if started is None or record.step <= 0 or record.progress_at is None:
        return None
    return max(0.0, (record.progress_at - started).total_seconds()) / record.step
