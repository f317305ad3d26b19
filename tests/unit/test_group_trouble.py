"""A worker group that cannot reach Ray for a while keeps its job; only lasting trouble,
or a rank that is really gone, fails the gang; a failed gang names the rank that failed
first, not its peers' collateral. No Ray needed: the status call is faked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RaySystemError

import scheduler.runtime.gangs.group
from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import CAUSE_GRACE_S, GroupPhase, aggregate
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


def rank_status(
    phase: str, failed_at: float | None = None, error: str | None = None
) -> dict[str, Any]:
    return {
        "phase": phase,
        "failed_at": failed_at,
        "error": error,
        "summary": None,
        "step": 3,
        "loss": 1.0,
        "first_loss": 2.0,
        "tokens_per_s": 10.0,
        "logs": [],
        "points": [],
    }


class Ranks:
    """Two rank actors whose status answers the test sets, served by a fake `ray`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers = [rank_status("running"), rank_status("running")]
        self.silent: set[int] = set()  # ranks whose supervisor does not answer
        self.errors: dict[int, Exception] = {}  # ranks whose status call fails
        fake_ray = SimpleNamespace(
            wait=lambda refs, num_returns, timeout: (
                [r for r in refs if r not in self.silent],
                [r for r in refs if r in self.silent],
            ),
            get=self._get,
        )
        monkeypatch.setattr(scheduler.runtime.gangs.group, "ray", fake_ray)

    def _get(self, refs: list[int]) -> list[dict[str, Any]]:
        for rank in refs:
            if rank in self.errors:
                raise self.errors[rank]
        return [self.answers[rank] for rank in refs]

    def group(self) -> WorkerGroup:
        pg: Any = None
        actors = [self._actor(rank) for rank in range(2)]
        spec = replace(SPEC, node_ids=("n1", "n2"), dp=2)
        return WorkerGroup(spec, pg, placement_timeout_s=1, actors=actors)

    @staticmethod
    def _actor(rank: int) -> Any:
        return SimpleNamespace(status=SimpleNamespace(remote=lambda *_: rank))


COLLATERAL = "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:4242"
CAUSE = "Traceback ...\nRuntimeError: bad batch"


def peer_failed(monkeypatch: pytest.MonkeyPatch) -> tuple[Ranks, WorkerGroup]:
    """Two running ranks, then rank 1 failed of its broken collective."""
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    ranks.answers[1] = rank_status("failed", failed_at=20.5, error=COLLATERAL)
    return ranks, group


def test_a_failed_gang_names_the_rank_that_raised_though_a_peer_was_marked_first(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks, group = peer_failed(monkeypatch)
    pending = group.poll()
    assert pending.phase is GroupPhase.RUNNING and pending.cause_pending
    clock.now += 2
    # its supervisor heard of the exception after rank 1's heard of the broken collective
    ranks.answers[0] = rank_status("failed", failed_at=20.7, error=CAUSE)
    failed = group.poll()
    assert failed.phase is GroupPhase.FAILED
    assert (failed.error or "").startswith("rank 0 failed (rank(s) 1 failed after it)")
    assert "bad batch" in (failed.error or "")


def test_a_failed_rank_fails_the_gang_once_the_grace_passes_without_a_cause(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, group = peer_failed(monkeypatch)
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += CAUSE_GRACE_S - 1
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += 2
    failed = group.poll()
    assert failed.phase is GroupPhase.FAILED and (failed.error or "").startswith("rank 1 failed")


def test_a_rank_that_failed_of_its_own_fails_the_gang_at_once(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    ranks.answers[1] = rank_status("failed", 20.0, "train:main was killed by signal 9")
    assert group.poll().phase is GroupPhase.FAILED


def test_a_gang_whose_every_rank_has_ended_fails_without_waiting(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    ranks.answers = [rank_status("succeeded"), rank_status("failed", 20.0, CAUSE)]
    assert group.poll().phase is GroupPhase.FAILED


@pytest.mark.parametrize(
    ("error", "waits"),
    [
        ("RuntimeError: [pair.cc:534] Connection closed by peer [10.0.0.2]:4242", True),
        ("RuntimeError: ... This is typically caused by a remote worker crashing.", True),
        ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1", True),
        ("RuntimeError: bad batch", False),
        ("train.py exited with code -9 (killed by signal 9)", False),
    ],
)
def test_only_a_peers_failure_waits_for_its_cause(error: str, waits: bool) -> None:
    statuses = [rank_status("running"), rank_status("failed", 20.0, error)]
    assert aggregate(statuses, wait_for_cause=True).cause_pending is waits


def test_a_rank_that_never_answers_fails_the_gang_once_the_grace_passes(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    ranks.silent.add(1)  # its supervisor is stopped: the call neither returns nor fails
    ranks.answers[0] = {**rank_status("running"), "logs": [(7, "rank 0's last words")]}
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += 59
    assert group.poll().phase is GroupPhase.RUNNING
    clock.now += 2
    failed = group.poll()
    assert failed.phase is GroupPhase.FAILED
    assert (failed.error or "").startswith(
        "rank(s) 1 (node n2) did not answer a status call in 61 s"
    )
    assert failed.lost_nodes == ("n2",)  # suspect: the restart goes elsewhere
    assert (0, 7, "rank 0's last words") in failed.logs


def test_errors_and_silence_between_them_fail_the_gang_once_the_grace_passes(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's call fails some seconds after each ask (an unreachable actor): the round
    that follows each failure is unanswered at first, which must not count as an answer."""
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    for _ in range(6):
        ranks.silent, ranks.errors = set(), {1: ActorUnavailableError("unreachable", None)}
        assert group.poll().phase is GroupPhase.RUNNING  # trouble
        ranks.silent, ranks.errors = {1}, {}
        clock.now += 5
        assert group.poll().phase is GroupPhase.RUNNING  # a new round, not yet answered
        clock.now += 5
    clock.now += 1
    ranks.silent, ranks.errors = set(), {1: ActorUnavailableError("unreachable", None)}
    failed = group.poll()
    assert failed.phase is GroupPhase.FAILED and "(for 61 s)" in (failed.error or "")


def test_a_late_answer_only_delays_the_round(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(monkeypatch)
    group = ranks.group()
    ranks.silent.add(1)
    group.poll()
    clock.now += 50
    ranks.silent.clear()
    assert group.poll().phase is GroupPhase.RUNNING  # the round ends; the next one is new
    ranks.silent.add(1)
    group.poll()
    clock.now += 50
    assert group.poll().phase is GroupPhase.RUNNING
