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
    """Measured progress of a job holding resources. Step time is the mean over this
    attempt so far (start-up included: the end estimate and the hang rule go by it).
    What a preemption loses: the steps since the newest checkpoint rank 0 reported at
    the step time it measured (`since_checkpoint_s`), where it reported both; else every
    step of the attempt at the mean (a resumed attempt's step counts earlier attempts'
    steps too, which only overstates the loss)."""
    started = record.started_at or record.admitted_at
    if record.placement is None or started is None:
        return None
    step_time_s = None
    if record.step > 0 and record.progress_at is not None:
        step_time_s = max(0.0, (record.progress_at - started).total_seconds()) / record.step
    return RunInfo(
        started_at=started,
        step=record.step,
        total_steps=record.total_steps,
        step_time_s=step_time_s,
        steps_since_checkpoint=record.step,
        since_checkpoint_s=_since_checkpoint_s(record),
    )


def _since_checkpoint_s(record: JobRecord) -> float | None:
    """Seconds of work since the newest checkpoint: the steps since it x rank 0's
    measured step time; None where either is unknown (or they disagree: a checkpoint
    ahead of the step)."""
    saved, measured = record.checkpoint_step, record.step_time_s
    if saved is None or measured is None or saved > record.step:
        return None
    return (record.step - saved) * measured
