"""Sweeps, the pure parts: ASHA's rule over trials, the rungs, the searchers (grid order,
seeded random and TPE reproduced from the same history), and paths into a job body."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gangway.models import SweepSubmit
from scheduler.core import Preempt, schedule
from scheduler.core.asha import (
    Budget,
    Continue,
    Finish,
    Pause,
    Promote,
    Rungs,
    Start,
    Stop,
    TrialState,
    TrialView,
    advance,
    go_on_bars,
    places,
)
from scheduler.runtime.searchers import grid_point, grid_size, suggest, trial_budget
from scheduler.runtime.sweeps import rungs_of, set_path, sweep_plan, trial_body, with_bars
from scheduler.store.sweeps import TrialRecord
from tests.unit.builders import NOW, Cluster, pending, running

R, P, C = TrialState.RUNNING, TrialState.PAUSED, TrialState.COMPLETED
RUNGS = Rungs(min_steps=10, factor=3, max_steps=90)  # rungs at 10, 30, 90


def trial(number: int, state: TrialState, rung: int, **values: float) -> TrialView:
    return TrialView(number, state, rung, {int(k[1:]): v for k, v in values.items()})


def test_rungs_grow_by_the_factor_up_to_the_budget() -> None:
    assert RUNGS.steps == (10, 30, 90) and RUNGS.last == 2
    assert Rungs(10, 3, 100).steps == (10, 30, 90, 100)
    assert Rungs(5, 2, 5).steps == (5,)
    with pytest.raises(ValueError, match="factor"):
        Rungs(10, 1, 90)


def test_an_empty_sweep_starts_as_many_trials_as_run_at_once() -> None:
    actions = advance([], RUNGS, Budget(max_trials=9, max_concurrent=3), minimize=True)
    assert actions == [Start(), Start(), Start()]


def test_a_trial_not_in_the_top_third_at_its_rung_pauses_and_a_new_one_starts() -> None:
    trials = [
        trial(0, P, 0, r0=1.0),
        trial(1, P, 0, r0=2.0),
        trial(2, R, 0, r0=3.0),  # just reached rung 0: third of three
    ]
    actions = advance(trials, RUNGS, Budget(9, 1), minimize=True)
    assert isinstance(actions[0], Pause) and actions[0].number == 2
    assert "not in the top 1 of 3" in actions[0].reason
    # trial 0 is the top 1 of 3 at rung 0: promoted into the free slot before a new start
    assert isinstance(actions[1], Promote) and (actions[1].number, actions[1].rung) == (0, 1)
    assert len(actions) == 2


def test_a_trial_in_the_top_goes_on_at_once() -> None:
    trials = [trial(0, P, 0, r0=2.0), trial(1, P, 0, r0=3.0), trial(2, R, 0, r0=1.0)]
    actions = advance(trials, RUNGS, Budget(9, 1), minimize=True)
    assert actions == [Continue(2, 1, "went on: in the top 1 of 3 at rung 0")]


def test_maximising_ranks_the_highest_first() -> None:
    trials = [trial(0, P, 0, r0=2.0), trial(1, P, 0, r0=3.0), trial(2, R, 0, r0=1.0)]
    actions = advance(trials, RUNGS, Budget(9, 1), minimize=False)
    assert isinstance(actions[0], Pause) and actions[0].number == 2
    assert isinstance(actions[1], Promote) and actions[1].number == 1


def test_promotion_takes_the_highest_rung_first() -> None:
    trials = [
        *(trial(i, P, 0, r0=float(i)) for i in range(6)),  # top 2 at rung 0: 0, 1
        trial(6, C, 2, r0=0.5, r1=0.4, r2=0.3),
        trial(7, P, 1, r0=0.6, r1=0.2),
        trial(8, P, 1, r0=0.7, r1=0.9),
    ]
    actions = advance(trials, RUNGS, Budget(20, 1), minimize=True)
    # rung 1 has 3 values (0.4, 0.2, 0.9): top 1 is trial 7
    assert actions == [Promote(7, 2, "promoted: in the top 1 of 3 at rung 1")]


def test_a_spent_budget_with_nothing_running_stops_the_paused_and_finishes() -> None:
    trials = [trial(0, C, 2, r0=1.0, r1=1.0, r2=1.0), trial(1, P, 0, r0=5.0)]
    actions = advance(trials, RUNGS, Budget(2, 2), minimize=True)
    assert actions == [
        Stop(1, "the sweep ended before it was promoted"),
        Finish("2 trials run; none left to start or promote"),
    ]


def test_once_every_trial_started_the_best_at_a_rung_always_goes_on() -> None:
    """4 trials, factor 3: floor(2 / 3) = 0 would let none past rung 1."""
    trials = [
        trial(0, P, 1, r0=1.0, r1=2.0),
        trial(1, R, 1, r0=1.5, r1=1.0),  # just reached rung 1: the better of two
        trial(2, P, 0, r0=3.0),
        trial(3, P, 0, r0=4.0),
    ]
    actions = advance(trials, RUNGS, Budget(4, 1), minimize=True)
    assert actions == [Continue(1, 2, "went on: in the top 1 of 2 at rung 1")]
    assert advance(trials, RUNGS, Budget(5, 1), minimize=True)[0] == Pause(
        1, 1, "paused at rung 1 (step 30): not in the top 0 of 2 recorded there"
    )


def test_a_bar_is_the_value_a_trial_must_beat_to_go_on_as_advance_would_let_it() -> None:
    """Each bar answers, for a value the new trial may report at a rung, what `advance`
    would then do: beat the bar -> Continue, else Pause."""
    trials = [
        trial(0, P, 0, r0=1.0),
        trial(1, P, 0, r0=2.0),
        trial(2, C, 2, r0=0.5, r1=0.8, r2=0.7),
        trial(3, P, 1, r0=0.9, r1=1.5),
    ]
    budget = Budget(9, 1)
    # rung 0: 5 values with the new one -> top 1: beat the best (0.5); rung 1: 3 -> top 1
    assert go_on_bars(trials, RUNGS, budget, number=4, minimize=True) == {
        0: 0.5,
        1: 0.8,
    }
    for value, goes_on in ((0.49, True), (0.5, False), (0.6, False)):
        reached = [*trials, trial(4, R, 0, r0=value)]
        action = advance(reached, RUNGS, budget, minimize=True)[0]
        assert isinstance(action, Continue) is goes_on and action.number == 4
    # the second trial: 2 values at rung 0 -> top floor(2/3) = 0: it stops whatever it
    # reports; once every trial has started, the best of two goes on
    first = [trial(0, P, 0, r0=1.0)]
    assert go_on_bars(first, RUNGS, budget, number=1, minimize=True) == {}
    assert go_on_bars(first, RUNGS, Budget(2, 1), number=1, minimize=True) == {
        0: 1.0,
        1: None,  # nobody there yet: the top 1 of 1 goes on whatever it reports
    }
    # a trial's own values do not count against it; maximising ranks the highest
    assert go_on_bars(trials, RUNGS, budget, number=3, minimize=False) == {0: 2.0}
    assert go_on_bars(trials, RUNGS, Budget(4, 1), number=3, minimize=False) == {
        0: 1.0,
        1: 0.8,
    }


def test_without_early_stopping_trials_run_to_the_end() -> None:
    trials = [trial(0, R, 0, r0=9.0), trial(1, C, 0, r0=1.0)]
    assert advance(trials, None, Budget(3, 2), minimize=True) == [Start()]
    done = [trial(0, C, 0, r0=9.0), trial(1, C, 0, r0=1.0)]
    assert advance(done, None, Budget(2, 2), minimize=True) == [
        Finish("2 trials run; none left to start or promote")
    ]


SPACE: dict[str, Any] = {
    "entrypoint.learning_rate": {"kind": "log_uniform", "low": 1e-5, "high": 3e-1},
    "entrypoint.batch_size": {"kind": "choice", "values": [4, 8, 16]},
}


def sweep(**fields: Any) -> SweepSubmit:
    body: dict[str, Any] = {
        "name": "lr",
        "base": {"name": "tiny", "entrypoint": {"kind": "builtin", "steps": 81}},
        "space": SPACE,
        **fields,
    }
    return SweepSubmit.model_validate(body)


def test_a_grid_walks_every_combination_last_dimension_fastest() -> None:
    space = sweep(searcher="grid").space
    points = [grid_point(space, n) for n in range(grid_size(space))]
    assert len(points) == 9 and trial_budget(sweep(searcher="grid")) == 9
    assert [p["entrypoint.batch_size"] for p in points[:3]] == [4, 8, 16]
    rates = sorted({p["entrypoint.learning_rate"] for p in points})
    assert rates[0] == pytest.approx(1e-5) and rates[-1] == pytest.approx(3e-1)
    assert rates[1] == pytest.approx((1e-5 * 3e-1) ** 0.5)  # log-spaced


@pytest.mark.parametrize("searcher", ["random", "tpe"])
def test_a_seeded_searcher_gives_the_same_trial_for_the_same_history(searcher: str) -> None:
    request = sweep(searcher=searcher, seed=7)
    history = [
        TrialRecord(i, 100 + i, suggest(request, i, [], (27, 81)), C, 1, {0: 3.0 - i, 1: 2.0})
        for i in range(12)
    ]
    first = suggest(request, 12, history, (27, 81))
    assert suggest(request, 12, history, (27, 81)) == first
    assert 1e-5 <= first["entrypoint.learning_rate"] <= 3e-1
    assert first["entrypoint.batch_size"] in (4, 8, 16)
    assert suggest(sweep(searcher=searcher, seed=8), 12, history, (27, 81)) != first


def test_a_trial_body_is_the_base_with_its_parameters_at_their_paths() -> None:
    plan = sweep_plan(sweep(early_stopping={"rule": "asha"}).model_dump(mode="json"))
    assert plan.rung_steps == (9, 27, 81)  # 81 / 3^2
    params = {"entrypoint.learning_rate": 0.01, "entrypoint.batch_size": 16}
    body = trial_body(plan, 4, params, {0: 1.5, 1: None})
    entry = body["entrypoint"]
    assert (entry["learning_rate"], entry["batch_size"], entry["eval_every"]) == (0.01, 16, 9)
    assert body["name"] == "lr-4"
    assert entry["pause_at"] == [9, 27]
    assert entry["pause_unless"] == [
        {"step": 9, "metric": "val_loss", "mode": "min", "better_than": 1.5},
        {"step": 27, "metric": "val_loss", "mode": "min", "better_than": None},
    ]
    assert with_bars(body, plan, {})["entrypoint"]["pause_unless"] == []
    # a trial that may not be preempted gets no bars: it stops at every rung
    fixed = sweep_plan(
        sweep(
            base={
                "name": "tiny",
                "preemptible": False,
                "entrypoint": {"kind": "builtin", "steps": 81},
            },
            early_stopping={"rule": "asha"},
        ).model_dump(mode="json")
    )
    entry = trial_body(fixed, 4, params, {0: 1.5})["entrypoint"]
    assert (entry["pause_at"], entry["pause_unless"]) == ([9, 27], [])


def test_paths_reach_keys_and_list_items_and_new_env_names_only() -> None:
    body: dict[str, Any] = {"entrypoint": {"argv": ["python", "x.py", "--lr", "0"]}, "env": {}}
    set_path(body, "entrypoint.argv.3", "0.1")
    set_path(body, "env.WARMUP", "5")
    assert body == {
        "entrypoint": {"argv": ["python", "x.py", "--lr", "0.1"]},
        "env": {"WARMUP": "5"},
    }
    with pytest.raises(KeyError):
        set_path(body, "entrypoint.nope", 1)
    with pytest.raises(IndexError):
        set_path(body, "entrypoint.argv.9", 1)


def test_early_stopping_needs_a_budget_for_a_job_that_is_not_the_builtin() -> None:
    command = sweep(
        base={"name": "c", "entrypoint": {"kind": "command", "argv": ["python", "t.py", "1"]}},
        space={"entrypoint.argv.2": {"kind": "choice", "values": ["1", "2"]}},
        early_stopping={"rule": "asha"},
    )
    with pytest.raises(ValueError, match="max_steps"):
        rungs_of(command)
    with pytest.raises(ValueError, match="cannot be searched"):
        sweep(space={"entrypoint.kind": {"kind": "choice", "values": ["command"]}})


def test_places_rank_running_trials_at_their_latest_rung() -> None:
    trials = [
        trial(0, R, 1, r0=1.0),  # second of four at rung 0
        trial(1, R, 1, r0=3.0),  # the worst there
        trial(2, P, 0, r0=2.0),  # paused: holds no GPUs, not ranked
        trial(3, R, 2, r0=0.5, r1=0.7),  # alone at rung 1
        trial(4, R, 0),  # no value yet
    ]
    assert places(trials, minimize=True) == {0: pytest.approx(1 / 3), 1: 1.0, 3: 0.5}
    assert places(trials, minimize=False)[1] == 0.0


def test_preemption_takes_the_trial_its_rule_ranks_lowest_first() -> None:
    """Two equal gangs would be preempted in the same order but for one being a poor
    trial: the high-priority job takes that one's GPUs."""
    cluster = Cluster().nodes(2, 2).snapshot()
    jobs = [
        running(1, ["n0"] * 2, step=10, step_time_s=1.0),
        replace(running(2, ["n1"] * 2, step=500, step_time_s=1.0), expendable=1.0),
        pending(3, dp=2, priority=9),
    ]
    preempts = [d for d in schedule(cluster, jobs, NOW) if isinstance(d, Preempt)]
    assert [p.job_id for p in preempts] == [2]  # though it loses more work than job 1


def test_a_grid_point_is_found_without_building_a_huge_grid() -> None:
    space = sweep(
        searcher="grid",
        space={f"env.X{i}": {"kind": "int", "low": 0, "high": 999} for i in range(3)},
    ).space
    assert grid_size(space) == 10**9
    assert grid_point(space, 1_234_567) == {"env.X0": 1, "env.X1": 234, "env.X2": 567}
    assert trial_budget(sweep(searcher="grid", space=space)) == 1000


HYPERBAND = Rungs(min_steps=27, factor=3, max_steps=729, brackets=4)  # 27, 81, 243, 729


def test_hyperband_deals_trials_to_brackets_in_its_proportions_first_ones_to_each() -> None:
    """Shares ceil(4/(s+1) x 3^s) for s = 3, 2, 1, 0 halvings: 27, 12, 6, 4."""
    dealt = [HYPERBAND.bracket_of(n) for n in range(49)]
    assert [dealt.count(b) for b in range(4)] == [27, 12, 6, 4]
    assert set(dealt[:12]) == {0, 1, 2, 3}  # a short sweep still hedges
    assert [HYPERBAND.bracket_of(n) for n in range(49, 98)] == dealt  # it repeats
    assert Rungs(27, 3, 729).bracket_of(5) == 0  # ASHA: one bracket
    # 24 brackets (factor 2 from step 1 to 10^7): shares up to 2^23, dealt only as far
    # as trial numbers ask, so a thousand trials cost a thousand turns, not 2^23 each
    many = Rungs(1, 2, 10_000_000, brackets=24)
    dealt = [many.bracket_of(n) for n in range(1000)]
    assert dealt[:4] == [0, 1, 0, 2] and set(dealt) <= set(range(24))
    with pytest.raises(ValueError, match="brackets"):
        Rungs(27, 3, 81, brackets=3)


def test_hyperband_ranks_values_within_a_bracket_only() -> None:
    """A trial that starts at rung 1 (bracket 1) is not measured against bracket 0's
    values there: it is alone in its bracket and goes on once every trial started."""
    assert [HYPERBAND.bracket_of(n) for n in range(3)] == [0, 1, 0]
    trials = [
        TrialView(0, P, 1, {0: 1.0, 1: 0.5}, 0),
        TrialView(1, R, 1, {1: 0.9}, 1),  # worse than trial 0's 0.5 at rung 1
        TrialView(2, P, 0, {0: 2.0}, 0),
    ]
    actions = advance(trials, HYPERBAND, Budget(3, 1), minimize=True)
    assert actions[0] == Continue(1, 2, "went on: in the top 1 of 1 at rung 1 in bracket 1")
    assert go_on_bars(trials, HYPERBAND, Budget(3, 1), number=1, minimize=True) == {
        1: None,
        2: None,
    }
    # in bracket 0, a second trial would stop at every rung whatever it reports
    assert go_on_bars(trials, HYPERBAND, Budget(9, 1), number=2, minimize=True) == {}
    assert places(trials, minimize=True) == {1: 0.5}


def test_a_hyperband_trial_pauses_only_at_its_brackets_rungs() -> None:
    plan = sweep_plan(
        sweep(early_stopping={"rule": "hyperband", "min_steps": 9}).model_dump(mode="json")
    )
    assert plan.rung_steps == (9, 27, 81) and plan.rungs is not None
    assert plan.rungs.brackets == 3
    params = {"entrypoint.learning_rate": 0.01}
    number = next(n for n in range(20) if plan.bracket_of(n) == 1)
    entry = trial_body(plan, number, params, {})["entrypoint"]
    assert (entry["pause_at"], entry["eval_every"]) == ([27], 27)
    last = next(n for n in range(20) if plan.bracket_of(n) == 2)
    assert trial_body(plan, last, params, {})["entrypoint"]["pause_at"] == []
