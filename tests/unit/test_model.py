"""The state machine and the wire/domain contracts."""

from __future__ import annotations

import pytest

from gangway import models
from scheduler import model
from scheduler.model import TRANSITIONS, JobState, Parallelism, is_legal_transition


def test_the_wire_and_the_scheduler_share_one_state_enum() -> None:
    assert models.JobState is model.JobState
    assert {s for s in JobState if s.is_terminal} == {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
    }


def test_terminal_states_have_no_way_out() -> None:
    for state in JobState:
        if state.is_terminal:
            assert TRANSITIONS[state] == frozenset()


def test_every_live_state_can_be_cancelled_or_failed() -> None:
    for state in JobState:
        if not state.is_terminal:
            assert is_legal_transition(state, JobState.CANCELLED)
            assert is_legal_transition(state, JobState.FAILED)


@pytest.mark.parametrize(
    ("old", "new", "legal"),
    [
        (JobState.PENDING, JobState.ADMITTED, True),
        (JobState.PENDING, JobState.RUNNING, False),
        (JobState.RUNNING, JobState.SUCCEEDED, True),
        (JobState.RUNNING, JobState.PENDING, True),
        (JobState.SUCCEEDED, JobState.CANCELLED, False),
        (JobState.RESTARTING, JobState.STARTING, True),
    ],
)
def test_transition_table(old: JobState, new: JobState, legal: bool) -> None:
    assert is_legal_transition(old, new) is legal


def test_parallelism_rejects_zero_degrees() -> None:
    with pytest.raises(ValueError, match=r"parallelism\.tp"):
        Parallelism(dp=2, tp=0)
    assert Parallelism(dp=2, tp=2, pp=2).world_size == 8
