"""The lifecycle's rules as a table: a job as stored + a gang's report -> the transition."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.model import JobState
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.lifecycle import (
    NEW_ATTEMPT,
    LifecycleConfig,
    Transition,
    next_transition,
    quiet_until,
)
from scheduler.store import JobRecord
from scheduler.store.specs import spec_from_json
from workers.supervisor.venvs import INSTALL_TIMEOUT_S

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
CONFIG = LifecycleConfig(hang_factor=10.0, hang_min_s=300.0, start_timeout_s=7200.0)
SPEC = {
    "max_restarts": 1,
    "parallelism": {"dp": 2, "tp": 1, "pp": 1},
    "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
    "entrypoint": {"kind": "builtin"},
}


def job(state: JobState, **changes: object) -> JobRecord:
    base = JobRecord(
        id=1,
        name="j",
        queue="default",
        user="u",
        priority=0,
        state=state,
        spec=spec_from_json(SPEC),
        num_gpus=2,
        submitted_at=T0,
        updated_at=T0,
        admitted_at=T0,
        started_at=T0,
        finished_at=None,
        status_reason="",
        error=None,
        attempt=1,
        restarts=0,
        placement=("n1", "n1"),
        step=10,
        total_steps=100,
        loss=None,
        first_loss=None,
        tokens_per_s=None,
        progress_at=NOW - timedelta(seconds=5),
        estimated_start_at=None,
        explanation=None,
        preempt_deadline=None,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


RUNNING = GroupStatus(GroupPhase.RUNNING, True, step=10)
FAILED = GroupStatus(GroupPhase.FAILED, True, step=12, error="boom", checkpoint_step=10)
DONE = GroupStatus(GroupPhase.SUCCEEDED, True, step=100)
STOPPED = GroupStatus(GroupPhase.SUCCEEDED, True, step=14, checkpoint_step=14, stop_ack_s=2.0)
DEADLINE_PASSED = {"preempt_deadline": NOW - timedelta(seconds=1)}
DEADLINE_AHEAD = {"preempt_deadline": NOW + timedelta(seconds=60)}
# 10 steps in 100 s: 10 s a step, so silence beyond max(300 s, 10 x 10 s) is a hang.
HUNG = {"started_at": NOW - timedelta(seconds=500), "progress_at": NOW - timedelta(seconds=400)}
# Past the 7200 s start timeout: admitted (starting) or started (running) that long ago.
LONG_AGO = NOW - timedelta(seconds=7201)
# A function (no step count): it may never report a step, so none is awaited.
FUNCTION = spec_from_json(
    {**SPEC, "entrypoint": {"kind": "function", "target": "m:f", "kwargs": {}}}
)
RENDEZVOUS = GroupStatus(GroupPhase.RENDEZVOUS)

CASES: list[tuple[str, JobRecord, GroupStatus, JobState | None, str]] = [
    ("started", job(JobState.STARTING), RUNNING, JobState.RUNNING, "all 2 ranks started"),
    ("still starting", job(JobState.STARTING), GroupStatus(GroupPhase.PLACING), None, ""),
    ("running, nothing new", job(JobState.RUNNING), RUNNING, None, ""),
    ("finished", job(JobState.RUNNING), DONE, JobState.SUCCEEDED, "finished at step 100"),
    ("failed, budget left", job(JobState.RUNNING), FAILED, JobState.RESTARTING, "restart 1 of 1"),
    (
        "failed, budget spent",
        job(JobState.RUNNING, restarts=1),
        FAILED,
        JobState.FAILED,
        "failed after 1 restart(s): boom",
    ),
    (
        "placement timeout",
        job(JobState.STARTING),
        GroupStatus(GroupPhase.PLACEMENT_TIMEOUT, error="no room"),
        JobState.PENDING,
        "no room",
    ),
    ("hung", job(JobState.RUNNING, **HUNG), RUNNING, JobState.RESTARTING, "hung: no progress"),
    (
        "stuck starting",
        job(JobState.STARTING, admitted_at=LONG_AGO),
        RENDEZVOUS,
        JobState.RESTARTING,
        "hung while starting: not every rank ready 7201 s after admission (limit: start",
    ),
    (
        "stuck starting, budget spent",
        job(JobState.STARTING, admitted_at=LONG_AGO, restarts=1),
        RENDEZVOUS,
        JobState.FAILED,
        "failed after 1 restart(s): hung while starting",
    ),
    (
        "no first step",
        job(JobState.RUNNING, step=0, progress_at=None, started_at=LONG_AGO),
        replace(RUNNING, step=0),
        JobState.RESTARTING,
        "hung: no progress past step 0 for 7201 s (limit 7200 s = the start timeout)",
    ),
    (
        # a resize's relaunch keeps the step; its new gang's first report (step 0) is
        # stored after the ranks started: still no step of this attempt to go by
        "built-in relaunched, back at step 0 since its start, no step after",
        job(JobState.RUNNING, step=0, started_at=LONG_AGO, progress_at=LONG_AGO),
        replace(RUNNING, step=0),
        JobState.RESTARTING,
        "hung: no progress past step 0 for 7201 s (limit 7200 s = the start timeout)",
    ),
    (
        "a function that never reported a step",
        job(JobState.RUNNING, spec=FUNCTION, total_steps=None, step=0, started_at=LONG_AGO),
        replace(RUNNING, step=0),
        None,
        "",
    ),
    ("starting within its timeout", job(JobState.STARTING), RENDEZVOUS, None, ""),
    (
        "built-in, first step within its timeout",
        job(JobState.RUNNING, step=0),
        replace(RUNNING, step=0),
        None,
        "",
    ),
    (
        "over its time limit",
        job(JobState.RUNNING, spec=spec_from_json({**SPEC, "time_limit_s": 60})),
        RUNNING,
        JobState.FAILED,
        "time limit of 60 s exceeded",
    ),
    ("preempting, waiting", job(JobState.PREEMPTING, **DEADLINE_AHEAD), RUNNING, None, ""),
    (
        "preempting, stopped",
        job(JobState.PREEMPTING, **DEADLINE_AHEAD),
        STOPPED,
        JobState.PENDING,
        "stopped at step 14 (2.0 s after the notice) and requeued",
    ),
    (
        "preempting, deadline passed",
        job(JobState.PREEMPTING, **DEADLINE_PASSED),
        RUNNING,
        JobState.PENDING,
        "killed at the deadline at step 10",
    ),
    (
        "preempting, finished meanwhile",
        job(JobState.PREEMPTING, **DEADLINE_AHEAD),
        DONE,
        JobState.SUCCEEDED,
        "finished at step 100 while stopping",
    ),
    (
        "preempting, a function that returned without being told to stop",
        job(JobState.PREEMPTING, total_steps=None, **DEADLINE_AHEAD),
        GroupStatus(GroupPhase.SUCCEEDED, True, step=7),
        JobState.SUCCEEDED,
        "finished at step 7 while stopping",
    ),
    (
        "preempting, a function that stopped when told",
        job(JobState.PREEMPTING, total_steps=None, **DEADLINE_AHEAD),
        replace(STOPPED, stop_seen=True),
        JobState.PENDING,
        "stopped at step 14 (2.0 s after the notice) and requeued",
    ),
    ("resizing, waiting", job(JobState.RESIZING, **DEADLINE_AHEAD), RUNNING, None, ""),
    (
        "resizing, saved and exited",
        job(JobState.RESIZING, **DEADLINE_AHEAD),
        STOPPED,
        JobState.ADMITTED,
        "relaunching at dp=2",
    ),
    (
        "resizing, crashed",
        job(JobState.RESIZING, **DEADLINE_AHEAD),
        FAILED,
        JobState.RESTARTING,
        "restart 1 of 1: boom",
    ),
    ("pending is not observed", job(JobState.PENDING), DONE, None, ""),
    ("a terminal job is not observed", job(JobState.SUCCEEDED), FAILED, None, ""),
]


@pytest.mark.parametrize(
    ("stored", "report", "to", "reason"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_next_transition(
    stored: JobRecord, report: GroupStatus, to: JobState | None, reason: str
) -> None:
    change = next_transition(stored, report, NOW, CONFIG)
    if to is None:
        assert change is None
        return
    assert change is not None and change.to is to
    assert reason in change.reason


@pytest.mark.parametrize(
    ("stored", "report"),
    [case[1:3] for case in CASES if case[3] is None],
    ids=[case[0] for case in CASES if case[3] is None],
)
def test_a_quiet_report_stays_quiet_until_the_moment_it_names(
    stored: JobRecord, report: GroupStatus
) -> None:
    """The loop skips judging a gang whose row and report did not change before
    `quiet_until`: the answer must not change before it, and does right after."""
    until = quiet_until(stored, report, CONFIG)
    if until is None:
        assert next_transition(stored, report, NOW + timedelta(days=365), CONFIG) is None
        return
    second = timedelta(seconds=1)
    assert until > NOW
    assert next_transition(stored, report, until - second, CONFIG) is None
    assert next_transition(stored, report, until + second, CONFIG) is not None


@pytest.mark.parametrize(
    "name",
    [
        "hung",
        "stuck starting",
        "no first step",
        "built-in relaunched, back at step 0 since its start, no step after",
        "over its time limit",
        "preempting, deadline passed",
    ],
)
def test_every_clock_rule_is_due_at_its_quiet_until(name: str) -> None:
    """The rules that read the clock fire after `quiet_until` and not before."""
    _, stored, report, _, _ = next(case for case in CASES if case[0] == name)
    until = quiet_until(stored, report, CONFIG)
    assert until is not None and until <= NOW
    assert next_transition(stored, report, until - timedelta(seconds=1), CONFIG) is None


def test_every_state_the_lifecycle_returns_is_in_the_table() -> None:
    returned = {case[3] for case in CASES} - {None}
    assert returned == {
        JobState.RUNNING,
        JobState.SUCCEEDED,
        JobState.RESTARTING,
        JobState.FAILED,
        JobState.PENDING,
        JobState.ADMITTED,
    }


def test_a_restart_requeues_and_counts_the_steps_lost_since_the_checkpoint() -> None:
    change = next_transition(job(JobState.RUNNING), FAILED, NOW, CONFIG)
    assert isinstance(change, Transition) and change.then is not None
    assert change.then.to is JobState.PENDING and change.lost_steps == 2
    assert change.fields["restarts"] == 1 and change.fields["error"] == "boom"


def test_a_failed_gang_names_the_nodes_where_ranks_were_lost() -> None:
    lost = replace(FAILED, lost_nodes=("n1",))
    change = next_transition(job(JobState.RUNNING), lost, NOW, CONFIG)
    assert change is not None and change.suspect_nodes == ("n1",)


def test_a_hang_asks_for_the_stacks_and_says_the_limit() -> None:
    change = next_transition(job(JobState.RUNNING, **HUNG), RUNNING, NOW, CONFIG)
    assert change is not None and change.with_stacks
    assert "limit 300 s" in change.reason


def test_a_resize_relaunch_is_the_next_attempt() -> None:
    change = next_transition(job(JobState.RESIZING, **DEADLINE_AHEAD), STOPPED, NOW, CONFIG)
    assert change is not None and change.relaunch and change.fields["attempt"] == 2
    # what the last gang measured of itself does not describe the next one
    assert {name: change.fields[name] for name in NEW_ATTEMPT} == dict(NEW_ATTEMPT)
    assert set(NEW_ATTEMPT) >= {"checkpoint_step", "step_time_s", "tokens_per_s", "error"}


def test_a_start_stuck_placing_says_ray_reserved_nothing() -> None:
    """Reached only with a placement timeout longer than the start timeout."""
    placing = GroupStatus(GroupPhase.PLACING)
    change = next_transition(job(JobState.STARTING, admitted_at=LONG_AGO), placing, NOW, CONFIG)
    assert change is not None and change.release
    assert "Ray had not reserved its placement 7201 s after admission" in change.reason
    assert "stacks" not in change.reason


def test_a_trainer_stopped_at_its_pause_point_is_held_not_done() -> None:
    paused_spec = {**SPEC, "entrypoint": {"kind": "builtin", "pause_at": [30, 60]}}
    running = job(JobState.RUNNING, spec=spec_from_json(paused_spec))
    at_pause = GroupStatus(GroupPhase.SUCCEEDED, True, step=30, checkpoint_step=30)
    change = next_transition(running, at_pause, NOW, CONFIG)
    assert change is not None and change.to is JobState.PENDING
    assert change.fields == {"placement": None, "hold": "paused at step 30: waits to be released"}
    # Elsewhere (its last step, or a step it was not told to stop at) it is done.
    for step in (100, 45):
        ended = GroupStatus(GroupPhase.SUCCEEDED, True, step=step)
        change = next_transition(running, ended, NOW, CONFIG)
        assert change is not None and change.to is JobState.SUCCEEDED


def test_the_start_timeout_outlasts_a_requirement_install() -> None:
    """A slow but legal install fails on its own limit, with pip's output, not as a hang."""
    assert LifecycleConfig().start_timeout_s > INSTALL_TIMEOUT_S
