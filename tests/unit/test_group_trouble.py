"""A worker group that cannot reach Ray for a while keeps its job; only lasting trouble,
or a rank that is really gone, fails the gang. No Ray needed: the status call is faked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RaySystemError

import scheduler.runtime.gangs.group
from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import GroupPhase
from workers.launch import BuiltinRun, JobLaunch

SPEC = GroupSpec(
    node_ids=("n1",),
    gpus_per_rank=1,
    cpus_per_rank=1.0,
    dp=1,
    tp=1,
    pp=1,
    launch=JobLaunch(job_id=1, attempt=1, user="u", run=BuiltinRun(fields={})),
)


class Clock:
    now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(scheduler.runtime.gangs.group, "time", clock)
    return clock


def _raise(error: Exception) -> Callable[[], None]:
    def poll_running() -> None:
        raise error

    return poll_running


def running_group(error: Exception, monkeypatch: pytest.MonkeyPatch) -> WorkerGroup:
    pg: Any = None  # never used: the group is past placement
    group = WorkerGroup(SPEC, pg, placement_timeout_s=1, actors=[object()], trouble_grace_s=60)

    monkeypatch.setattr(group, "_poll_running", _raise(error))
    monkeypatch.setattr(group, "_nodes_of_dead_ranks", lambda: ("n1",))
    return group


@pytest.mark.parametrize(
    "error", [ActorUnavailableError("network blip", b"\0" * 16), RaySystemError("gcs down")]
)
def test_trouble_keeps_the_gang_until_it_lasts_past_the_grace(
    error: Exception, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = running_group(error, monkeypatch)
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += 59
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += 2
    failed = group.poll()
    assert failed.phase is GroupPhase.FAILED and "(for 61 s)" in (failed.error or "")


def test_an_answer_ends_the_trouble(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    group = running_group(RaySystemError("gcs down"), monkeypatch)
    group.poll()
    clock.now += 50
    monkeypatch.setattr(group, "_poll_running", lambda: None)
    group.poll()  # Ray answered: the clock starts over
    monkeypatch.setattr(group, "_poll_running", _raise(RaySystemError("gcs down again")))
    clock.now += 50
    assert group.poll().phase is GroupPhase.RUNNING


def test_a_dead_actor_fails_at_once(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = running_group(ActorDiedError(), monkeypatch).poll()
    assert failed.phase is GroupPhase.FAILED and failed.lost_nodes == ("n1",)
