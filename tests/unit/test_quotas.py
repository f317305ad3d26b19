"""Queue quotas (guarantee, borrowing, reclaim) and fair share by recent usage."""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduler.core import Admit, Blocker, PolicyConfig, Preempt, Wait, queue_order, schedule
from scheduler.core.fairshare import UsageInterval, decayed_usage
from scheduler.model import QueueQuota
from tests.unit.builders import NOW, Cluster, at, pending, running

ONE_NODE = Cluster().nodes(1, 8).snapshot()


def test_a_queue_may_borrow_idle_gpus_up_to_its_limit() -> None:
    queues = {"a": QueueQuota(guaranteed_gpus=2, borrow_limit_gpus=2)}
    jobs = [pending(1, dp=4, queue="a"), pending(2, dp=1, queue="a", submitted=-1)]
    decisions = {d.job_id: d for d in schedule(ONE_NODE, jobs, NOW, queues=queues)}
    assert isinstance(decisions[1], Admit)
    wait = decisions[2]
    assert isinstance(wait, Wait) and wait.explanation.blocker is Blocker.QUOTA
    assert "limit of 4 (2 guaranteed + 2 borrowable)" in wait.explanation.message


def test_a_job_over_its_quota_does_not_block_other_queues() -> None:
    queues = {"a": QueueQuota(guaranteed_gpus=0, borrow_limit_gpus=0)}
    jobs = [pending(1, queue="a", priority=9), pending(2, queue="b")]
    decisions = {d.job_id: d for d in schedule(ONE_NODE, jobs, NOW, queues=queues)}
    assert isinstance(decisions[1], Wait) and isinstance(decisions[2], Admit)


def test_the_owner_reclaims_borrowed_gpus_whatever_their_priority() -> None:
    queues = {"owner": QueueQuota(guaranteed_gpus=4), "guest": QueueQuota(guaranteed_gpus=0)}
    jobs = [
        running(1, ["n0"] * 4, queue="guest", priority=9, started=-3600),
        running(2, ["n0"] * 4, queue="guest", priority=9, started=-1800),
        pending(3, dp=4, queue="owner", priority=0),
    ]
    decisions = schedule(ONE_NODE, jobs, NOW, queues=queues)
    preempts = [d for d in decisions if isinstance(d, Preempt)]
    assert [p.job_id for p in preempts] == [2]  # the most recently started borrower
    assert "reclaims GPUs that queue 'guest' borrowed" in preempts[0].reason


def test_no_reclaim_beyond_the_guarantee() -> None:
    queues = {"owner": QueueQuota(guaranteed_gpus=2), "guest": QueueQuota()}
    jobs = [running(1, ["n0"] * 8, queue="guest", priority=9), pending(2, dp=4, queue="owner")]
    assert not any(isinstance(d, Preempt) for d in schedule(ONE_NODE, jobs, NOW, queues=queues))


def test_borrowers_are_victims_before_lower_priority_owners() -> None:
    queues = {"a": QueueQuota(guaranteed_gpus=4), "b": QueueQuota(guaranteed_gpus=0)}
    jobs = [
        running(1, ["n0"] * 4, queue="a", priority=0),  # within a's guarantee
        running(2, ["n0"] * 4, queue="b", priority=1),  # borrowing
        pending(3, dp=4, queue="c", priority=5),
    ]
    preempts = [d for d in schedule(ONE_NODE, jobs, NOW, queues=queues) if isinstance(d, Preempt)]
    assert [p.job_id for p in preempts] == [2]


def test_fair_share_puts_the_lighter_user_first_at_equal_priority() -> None:
    jobs = [pending(1, user="heavy", submitted=-100), pending(2, user="light", submitted=-10)]
    usage = {("default", "heavy"): 1e6, ("default", "light"): 10.0}
    decisions = schedule(Cluster().nodes(1, 1).snapshot(), jobs, NOW, usage=usage)
    assert [d.job_id for d in decisions if isinstance(d, Admit)] == [2]


def test_priority_still_beats_fair_share() -> None:
    jobs = [pending(1, user="heavy", priority=1), pending(2, user="light")]
    usage = {("default", "heavy"): 1e6}
    decisions = schedule(Cluster().nodes(1, 1).snapshot(), jobs, NOW, usage=usage)
    assert [d.job_id for d in decisions if isinstance(d, Admit)] == [1]


def test_decayed_usage_halves_every_half_life() -> None:
    hour = timedelta(hours=1)
    recent = UsageInterval("q", "u", 4, NOW - hour, NOW)
    older = UsageInterval("q", "v", 4, NOW - 2 * hour, NOW - hour)
    usage = decayed_usage([recent, older], NOW, half_life_s=3600)
    assert usage[("q", "v")] == pytest.approx(usage[("q", "u")] / 2)
    # one GPU-hour just now counts about 1/(2 ln 2) ~ 0.72 of an undecayed one
    running_now = UsageInterval("q", "w", 1, at(-3600), None)
    assert decayed_usage([running_now], NOW, 3600)[("q", "w")] == pytest.approx(
        3600 / (2 * 0.6931), rel=1e-3
    )
    assert decayed_usage([UsageInterval("q", "x", 1, NOW, None)], NOW, 3600) == {}


def test_queues_contend_by_recent_usage_over_their_weight() -> None:
    jobs = [
        pending(1, queue="busy", user="a", submitted=-100),
        pending(2, queue="idle", user="b", submitted=-10),
    ]
    usage = {("busy", "a"): 3000.0, ("idle", "b"): 1000.0}
    one_gpu = Cluster().nodes(1, 1).snapshot()

    def admitted(queues: dict[str, QueueQuota]) -> list[int]:
        decisions = schedule(one_gpu, jobs, NOW, queues=queues, usage=usage)
        return [d.job_id for d in decisions if isinstance(d, Admit)]

    assert admitted({}) == [2]  # equal weights: the less used queue first, despite submit
    assert admitted({"busy": QueueQuota(weight=2.0)}) == [2]  # 3000 / 2 > 1000 / 1
    assert admitted({"busy": QueueQuota(weight=4.0)}) == [1]  # 3000 / 4 < 1000 / 1
    assert admitted({"busy": QueueQuota(weight=3.0)}) == [1]  # a tie goes by name
    assert schedule(one_gpu, jobs, NOW)[0].job_id == 1  # no usage yet: submit order


def test_users_are_ranked_within_their_queue_after_the_queue() -> None:
    jobs = [
        pending(1, queue="q", user="heavy", submitted=-100),
        pending(2, queue="q", user="light", submitted=-10),
        pending(3, queue="other", user="x", submitted=-200),
    ]
    usage = {("q", "heavy"): 50.0, ("q", "light"): 1.0, ("other", "x"): 500.0}
    order = queue_order(jobs, NOW, PolicyConfig(), usage)
    assert [j.id for j in order] == [2, 1, 3]


def test_a_queue_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight"):
        QueueQuota(weight=0.0)
