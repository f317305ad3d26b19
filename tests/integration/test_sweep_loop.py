"""A sweep driven by the scheduler loop on a real database (SQLite and PostgreSQL), with a
fake cluster whose "trainer" reports a validation loss that depends on the learning rate:
ASHA pauses trials (checkpoint, hold), promotes the good ones (released, they resume from
the step they stopped at), starts new ones within the budget and the concurrency, stops
the rest and ends; a service restart in the middle loses no trial and makes none twice."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gangway.models import SweepSubmit
from scheduler.core.asha import TrialState
from scheduler.model import JobState
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.loop import SchedulerLoop
from scheduler.store import AccountRepository, JobRepository, NewJob, QueueRepository
from scheduler.store.records import ReportedPoint
from scheduler.store.sweeps import SweepState
from tests.integration.test_loop import Clock, FakeExecutor, make_loop
from tests.integration.test_loop import clock as clock
from tests.integration.test_loop import repo as repo

STEPS_PER_PASS = 2
BUDGET = 27  # rungs at 3, 9, 27


def val_loss(learning_rate: float, step: int) -> float:
    """Best near 1e-2; lower the longer it trains."""
    return (math.log10(learning_rate) + 2) ** 2 + 1 + 10 / step


@dataclass
class FakeTrainer:
    """Every gang advances STEPS_PER_PASS steps a pass, reports val_loss every
    `eval_every` steps and at its end, stops at its `pause_at` steps (unless its value
    there beats the step's bar) and when told to, with a checkpoint, and resumes from the
    step it stopped at."""

    repo: JobRepository
    executor: FakeExecutor
    steps: dict[int, int] = field(default_factory=dict)
    steps_per_pass: int = STEPS_PER_PASS
    seq: dict[tuple[int, int], int] = field(default_factory=dict)
    stops_seen: int = 0

    def move(self) -> None:
        stopped = set(self.executor.stopped[self.stops_seen :])
        self.stops_seen = len(self.executor.stopped)
        for job_id in list(self.executor.statuses):
            job = self.repo.get(job_id)
            step = self.steps.get(job_id, job.step)
            if job_id in stopped or job.state is JobState.PREEMPTING:
                self.executor.statuses[job_id] = GroupStatus(
                    GroupPhase.SUCCEEDED, True, step=step, checkpoint_step=step, stop_seen=True
                )
                continue
            if job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            entry = job.spec_json["entrypoint"]
            total, every = entry["steps"], entry["eval_every"]
            after = min(total, step + self.steps_per_pass)
            lr = entry["learning_rate"]
            pause = [
                p
                for p in entry["pause_at"]
                if step < p <= after and not _beats_its_bar(entry, p, val_loss(lr, p))
            ]
            after = pause[0] if pause else after  # the trainer stops there, saved
            points = []
            for at in range(step + 1, after + 1):
                if at % every == 0 or at == total:
                    seq = self.seq[(job_id, job.attempt)] = (
                        self.seq.get((job_id, job.attempt), 0) + 1
                    )
                    value = val_loss(lr, at)
                    points.append(ReportedPoint(seq, at, time.time(), {"val_loss": value}))
            self.steps[job_id] = after
            phase = GroupPhase.SUCCEEDED if after >= total or pause else GroupPhase.RUNNING
            self.executor.statuses[job_id] = GroupStatus(
                phase, True, step=after, checkpoint_step=after, points=tuple(points)
            )


def _beats_its_bar(entry: dict[str, Any], step: int, value: float) -> bool:
    """The trainer goes on past a pause step whose bar its value beats."""
    bar = next((b for b in entry["pause_unless"] if b["step"] == step), None)
    return bar is not None and (bar["better_than"] is None or value < bar["better_than"])


def create_sweep(repo: JobRepository, **fields: Any) -> int:
    request = SweepSubmit.model_validate(
        {
            "name": "lr",
            "base": {
                "name": "tiny",
                "parallelism": {"dp": 1},
                "entrypoint": {"kind": "builtin", "steps": BUDGET},
            },
            "space": {"entrypoint.learning_rate": {"kind": "log_uniform", "low": 1e-4, "high": 1}},
            "searcher": "random",
            "early_stopping": {"rule": "asha", "min_steps": 3, "reduction_factor": 3},
            "max_trials": 9,
            "max_concurrent": 3,
            "seed": 1,
            **fields,
        }
    )
    return repo.create_sweep("lr", "default", request.model_dump(mode="json")).id


def drive(loop: SchedulerLoop, trainer: FakeTrainer, passes: int) -> Iterator[int]:
    for index in range(passes):
        trainer.move()
        loop.tick()
        yield index


def test_asha_pauses_promotes_and_ends_a_sweep_within_its_budget(
    repo: JobRepository, clock: Clock
) -> None:
    sweep_id = create_sweep(repo, max_concurrent=2)
    executor = FakeExecutor()
    loop = make_loop(repo, executor, clock)
    trainer = FakeTrainer(repo, executor)
    most_at_once = 0
    for _ in drive(loop, trainer, 400):
        running = [t for t in repo.sweep(sweep_id).trials if t.state is TrialState.RUNNING]
        most_at_once = max(most_at_once, len(running))
        if repo.sweep(sweep_id).state is not SweepState.RUNNING:
            break
    sweep = repo.sweep(sweep_id)
    assert sweep.state is SweepState.SUCCEEDED, sweep.reason
    assert [t.number for t in sweep.trials] == list(range(9))
    assert most_at_once == 2
    states = {t.state for t in sweep.trials}
    assert states <= {TrialState.COMPLETED, TrialState.STOPPED}
    completed = [t for t in sweep.trials if t.state is TrialState.COMPLETED]
    assert 1 <= len(completed) <= 3  # 9 -> 3 -> 1 (+ early promotions)
    jobs = {t.number: repo.get(t.job_id) for t in sweep.trials}
    assert all(job.state.is_terminal for job in jobs.values())
    steps_spent = sum(job.step for job in jobs.values())
    assert steps_spent < 9 * BUDGET / 2  # what early stopping saves
    # The best completed trial is the best learning rate among those tried.
    best = min(completed, key=lambda t: t.values[2])
    tried = [t.params["entrypoint.learning_rate"] for t in sweep.trials]
    assert best.params["entrypoint.learning_rate"] == min(
        tried, key=lambda lr: abs(math.log10(lr) + 2)
    )
    # A trial whose value at rung 0 beat the bar it was started with went on at once, in
    # its first attempt: its trainer never stopped there.
    went_on = [n for n, job in jobs.items() if job.attempt == 1 and job.step > 3]
    assert went_on
    for number in went_on:
        reasons = [e.reason for e in repo.events(jobs[number].id)]
        assert not any(r.startswith("paused at step 3") for r in reasons), reasons
    # A trial paused at a rung (checkpoint, hold) was released once it was the top third
    # there: it resumed from the step it stopped at (a second attempt), never admitted
    # while held.
    promoted = [
        n
        for n, job in jobs.items()
        if any("promoted: in the top" in e.reason for e in repo.events(job.id))
    ]
    assert promoted
    for number in promoted:
        events = repo.events(jobs[number].id)
        reasons = [e.reason for e in events]
        paused = next(i for i, r in enumerate(reasons) if r.startswith("paused by sweep"))
        released = next(i for i, r in enumerate(reasons) if "promoted: in the top" in r)
        admitted = [i for i, e in enumerate(events) if e.to_state is JobState.ADMITTED]
        assert paused < released < admitted[1] and jobs[number].attempt >= 2
        assert all(not paused < i < released for i in admitted)  # held: never admitted
    assert {job.step for job in jobs.values()} <= {3, 9, 27}  # each stopped at a rung


def test_a_restart_mid_sweep_loses_no_trial_and_makes_none_twice(
    repo: JobRepository, clock: Clock
) -> None:
    sweep_id = create_sweep(repo)
    executor = FakeExecutor()
    trainer = FakeTrainer(repo, executor)
    for _ in drive(make_loop(repo, executor, clock), trainer, 12):
        pass
    before = repo.sweep(sweep_id).trials
    assert before, "trials started before the restart"

    # The service dies; Ray keeps the gangs; a new service reattaches and carries on.
    restarted = FakeExecutor(attachable=set(executor.statuses))
    again = make_loop(repo, restarted, clock)
    again.reconcile()
    trainer = FakeTrainer(repo, restarted, steps=dict(trainer.steps))
    for _ in drive(again, trainer, 400):
        if repo.sweep(sweep_id).state is not SweepState.RUNNING:
            break
    after = repo.sweep(sweep_id)
    assert after.state is SweepState.SUCCEEDED
    assert [t.number for t in after.trials] == list(range(9))
    assert len({t.job_id for t in after.trials}) == 9
    for old in before:
        kept = after.trials[old.number]
        assert (kept.job_id, kept.params) == (old.job_id, old.params)


def test_rungs_passed_between_two_passes_are_each_recorded_and_judged(
    repo: JobRepository, clock: Clock
) -> None:
    """A trainer that moves 30 steps a pass passes every rung its bars let it between two
    passes: each rung's value is recorded (the board misses none), and a trial held at a
    later rung than the one it is let on toward is judged there, not released first."""
    sweep_id = create_sweep(repo, max_concurrent=2)
    executor = FakeExecutor()
    loop = make_loop(repo, executor, clock)
    trainer = FakeTrainer(repo, executor, steps_per_pass=30)
    for _ in drive(loop, trainer, 400):
        if repo.sweep(sweep_id).state is not SweepState.RUNNING:
            break
    sweep = repo.sweep(sweep_id)
    assert sweep.state is SweepState.SUCCEEDED, sweep.reason
    for trial in sweep.trials:
        job = repo.get(trial.job_id)
        reached = [r for r, at in enumerate((3, 9, 27)) if at <= job.step]
        assert sorted(trial.values) == reached, (trial.number, job.step, trial.values)
        reasons = [e.reason for e in repo.events(job.id)]
        released = [r for r in reasons if "resumes toward rung" in r]
        assert len(released) == job.attempt - 1  # every release made an attempt
    assert any(t.state is TrialState.COMPLETED for t in sweep.trials)


def test_a_hyperband_sweep_starts_each_bracket_at_its_rung_and_ends(
    repo: JobRepository, clock: Clock
) -> None:
    """Hyperband over rungs 3, 9, 27: trials dealt to three brackets; a trial of bracket
    1 first stops (or is judged) at step 9 and one of bracket 2 runs to the end; values
    are ranked within a bracket."""
    sweep_id = create_sweep(
        repo, early_stopping={"rule": "hyperband", "min_steps": 3, "reduction_factor": 3}
    )
    executor = FakeExecutor()
    loop = make_loop(repo, executor, clock)
    trainer = FakeTrainer(repo, executor)
    for _ in drive(loop, trainer, 400):
        if repo.sweep(sweep_id).state is not SweepState.RUNNING:
            break
    sweep = repo.sweep(sweep_id)
    assert sweep.state is SweepState.SUCCEEDED, sweep.reason
    assert [t.number for t in sweep.trials] == list(range(9))
    brackets = {0: 0, 1: 1, 3: 2}  # Hyperband's dealing of the first trials (unit test)
    jobs = {t.number: repo.get(t.job_id) for t in sweep.trials}
    entries = {n: jobs[n].spec_json["entrypoint"] for n in brackets}
    assert [entries[n]["eval_every"] for n in (0, 1, 3)] == [3, 9, 27]
    assert jobs[3].step == BUDGET and sweep.trials[3].state is TrialState.COMPLETED
    assert jobs[1].step >= 9 and set(sweep.trials[1].values) >= {1}
    assert 0 not in sweep.trials[1].values  # never judged at rung 0
    judged = [e.reason for t in sweep.trials for e in repo.events(t.job_id)]
    assert any("in bracket 0" in r for r in judged) and any("in bracket 1" in r for r in judged)


def test_a_sweep_that_cannot_go_on_ends_without_stopping_anyone_elses_jobs(
    repo: JobRepository, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial body that is not a job ends its sweep FAILED with the reason; a sweep
    whose passes raise ends after three; the loop schedules everyone else throughout."""
    bad = create_sweep(  # a float batch size: refused as a job, never stored
        repo, space={"entrypoint.batch_size": {"kind": "uniform", "low": 4, "high": 16}}
    )
    broken = create_sweep(repo)
    executor = FakeExecutor()
    loop = make_loop(repo, executor, clock)
    real = loop._sweeps._advance

    def raises_for_one(sweep: Any) -> None:
        if sweep.id == broken:
            raise RuntimeError("a bug")
        real(sweep)

    monkeypatch.setattr(loop._sweeps, "_advance", raises_for_one)
    other = repo.create(
        NewJob("other", "default", 0, {"entrypoint": {"kind": "builtin", "steps": 5}}, 1, 5)
    )
    for _ in range(3):
        loop.tick()
    refused = repo.sweep(bad)
    assert refused.state is SweepState.FAILED and refused.trials == []
    assert refused.reason.startswith("trial 0 (entrypoint.batch_size=")
    assert "is not a valid job" in refused.reason
    failed = repo.sweep(broken)
    assert failed.state is SweepState.FAILED
    assert failed.reason == "3 passes in a row failed: RuntimeError: a bug"
    assert other.id in [job_id for job_id, _, _ in executor.launched]


def test_a_sweep_whose_owner_left_its_queue_makes_no_more_trials(
    repo: JobRepository, clock: Clock
) -> None:
    """Membership is checked for every trial, not only at submit: a user an admin
    removed from the queue adds no job to it through a sweep sent before."""
    AccountRepository(repo.engine).create_user("alice", "user")
    base = {
        "name": "tiny",
        "user": "alice",
        "queue": "research",
        "parallelism": {"dp": 1},
        "entrypoint": {"kind": "builtin", "steps": BUDGET},
    }
    sweep = create_sweep(repo, base=base)
    QueueRepository(repo.engine).set_members("research", ["bob"])
    make_loop(repo, FakeExecutor(), clock).tick()
    ended = repo.sweep(sweep)
    assert ended.state is SweepState.FAILED and ended.trials == []
    assert ended.reason == "trial 0: queue 'research' is for its members, and alice is not one now"
