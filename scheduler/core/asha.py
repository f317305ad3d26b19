"""Asynchronous successive halving (ASHA, Li et al. 2020), as a pure rule over a sweep's
trials: which to continue, pause, promote, stop, and how many new ones to start.

Rungs are step counts `min_steps x factor^k` up to the trial's whole budget. A trial that
reaches a rung has its objective recorded there; it goes on at once if it is in the top
1/`factor` of every value recorded at that rung so far, else it pauses (its job stops with
a checkpoint and is held: it frees its GPUs). Whenever a trial slot is free, the best
paused trial that has since become top 1/`factor` at its rung is promoted (it resumes from
its checkpoint, never from step 0), highest rung first; else a new trial starts while the
budget lasts. Once every trial has started, the top share at a rung is rounded up
instead of down, so the best trial at each rung can always go on and the sweep ends with
at least one trial trained to the end (with 4 trials and a factor of 3, none would pass
rung 1 otherwise). When nothing runs, nothing can be promoted and the budget is spent, the
paused trials are stopped and the sweep ends.

Hyperband (`Rungs.brackets` > 1) runs several such ASHAs side by side, each starting its
trials at a later rung: a hedge against early values that mislead.

Determined's adaptive ASHA and Ray Tune's ASHA scheduler follow the same paper; the
difference here is that a pause is the scheduler's own preemption (checkpoint, hold), so a
paused trial costs nothing until it is promoted.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class TrialState(enum.StrEnum):
    RUNNING = "running"  # its job is working toward its next rung (or its end)
    PAUSED = "paused"  # stopped at a rung with its checkpoint, held until promoted
    COMPLETED = "completed"  # ran its whole budget
    STOPPED = "stopped"  # ended by the sweep: never promoted, or the sweep cancelled
    FAILED = "failed"  # its job failed or was cancelled by someone else

    @property
    def ended(self) -> bool:
        return self in (TrialState.COMPLETED, TrialState.STOPPED, TrialState.FAILED)


@dataclass(frozen=True, slots=True)
class Rungs:
    """Rung k is at `min_steps x factor^k` steps; the last is the whole budget.

    `brackets` > 1 is Hyperband (Li et al. 2018) run asynchronously: bracket b is an ASHA
    of its own whose trials start at rung b (bracket 0 stops the earliest, the last runs
    every trial to the end), so a search whose early values mislead still has trials
    judged later. Trials are dealt to brackets in Hyperband's proportions (bracket b with
    s = last - b halvings gets ceil((last + 1) / (s + 1) x factor^s) shares), interleaved
    so the first trials cover every bracket; values are ranked within a bracket only."""

    min_steps: int
    factor: int
    max_steps: int
    brackets: int = 1

    def __post_init__(self) -> None:
        if self.min_steps < 1 or self.factor < 2 or self.max_steps < self.min_steps:
            raise ValueError("rungs need 1 <= min_steps <= max_steps and factor >= 2")
        if not 1 <= self.brackets <= len(self.steps):
            raise ValueError("rungs need 1 <= brackets <= the number of rungs")

    def bracket_of(self, number: int) -> int:
        """Trial `number`'s bracket: smooth weighted round-robin over the shares (the
        bracket furthest behind its share next, lowest first), so the same number always
        lands in the same bracket. Dealt once per set of shares and kept: O(brackets)
        per trial number, however many trials and brackets."""
        if self.brackets == 1:
            return 0
        return _dealer(tuple(self._shares())).bracket(number)

    def _shares(self) -> list[int]:
        last = len(self.steps) - 1
        return [
            math.ceil((last + 1) / (s + 1) * self.factor**s)
            for s in (last - b for b in range(self.brackets))
        ]

    @property
    def steps(self) -> tuple[int, ...]:
        found, at = [], self.min_steps
        while at < self.max_steps:
            found.append(at)
            at *= self.factor
        return (*found, self.max_steps)

    @property
    def last(self) -> int:
        return len(self.steps) - 1


class _Dealer:
    """The order in which smooth weighted round-robin deals trials to brackets, dealt as
    far as a trial number has asked (it repeats every sum(shares) trials)."""

    def __init__(self, shares: tuple[int, ...]) -> None:
        self.shares, self.total = shares, sum(shares)
        self.current = [0] * len(shares)
        self.order: list[int] = []

    def bracket(self, number: int) -> int:
        turn = number % self.total
        while len(self.order) <= turn:
            for b, share in enumerate(self.shares):
                self.current[b] += share
            chosen = max(range(len(self.shares)), key=lambda b: (self.current[b], -b))
            self.current[chosen] -= self.total
            self.order.append(chosen)
        return self.order[turn]


@functools.cache
def _dealer(shares: tuple[int, ...]) -> _Dealer:
    return _Dealer(shares)


@dataclass(frozen=True, slots=True)
class TrialView:
    number: int
    state: TrialState
    rung: int  # the rung it works toward (running) or stopped at (paused)
    values: dict[int, float] = field(default_factory=dict)  # rung -> objective there
    bracket: int = 0  # `Rungs.bracket_of(number)`; its first rung


@dataclass(frozen=True, slots=True)
class Continue:
    number: int
    rung: int  # the next rung it now works toward
    reason: str


@dataclass(frozen=True, slots=True)
class Pause:
    number: int
    rung: int
    reason: str


@dataclass(frozen=True, slots=True)
class Promote:
    number: int
    rung: int  # the next rung it now works toward
    reason: str


@dataclass(frozen=True, slots=True)
class Start:
    """Start one new trial."""


@dataclass(frozen=True, slots=True)
class Stop:
    number: int
    reason: str


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str


Action = Continue | Pause | Promote | Start | Stop | Finish


@dataclass(frozen=True, slots=True)
class Budget:
    max_trials: int
    max_concurrent: int


def advance(
    trials: Sequence[TrialView], rungs: Rungs | None, budget: Budget, *, minimize: bool
) -> list[Action]:
    """What to do now. `rungs` None: no early stopping (every trial runs its budget)."""
    boards = _boards(trials, rungs, minimize, all_started=len(trials) >= budget.max_trials)
    actions: list[Action] = []
    active = 0
    for trial in trials:
        if trial.state is not TrialState.RUNNING:
            continue
        board = boards[trial.bracket]
        if rungs is None or trial.rung >= rungs.last or trial.rung not in trial.values:
            active += 1
        elif (why := board.promotable(trial.number, trial.rung)) is not None:
            actions.append(Continue(trial.number, trial.rung + 1, f"went on: {why}"))
            active += 1
        else:
            actions.append(Pause(trial.number, trial.rung, board.not_top(trial.rung)))
    pausing = {a.number for a in actions if isinstance(a, Pause)}
    paused = [t for t in trials if t.state is TrialState.PAUSED or t.number in pausing]
    started = len(trials)
    while active < budget.max_concurrent:
        candidate = _best_paused(boards, paused)
        if candidate is not None:
            trial, why = candidate
            actions.append(Promote(trial.number, trial.rung + 1, f"promoted: {why}"))
            paused.remove(trial)
        elif started < budget.max_trials:
            actions.append(Start())
            started += 1
        else:
            break
        active += 1
    if active == 0 and started >= budget.max_trials:
        reason = "the sweep ended before it was promoted"
        actions += [Stop(t.number, reason) for t in paused]
        actions.append(Finish(f"{started} trials run; none left to start or promote"))
    return actions


def go_on_bars(
    trials: Sequence[TrialView],
    rungs: Rungs,
    budget: Budget,
    *,
    number: int,
    minimize: bool,
) -> dict[int, float | None]:
    """What the new trial `number` needs at each rung of its bracket but the last to go
    on there without stopping: rung -> the value to beat (None: any value goes on; a
    rung left out: it stops there whatever it reports). The same rule as `advance` with
    the trial's value added to the values recorded there now, so its trainer can go on
    at once where the sweep would let it (no stop, no restart); values other trials
    record meanwhile may change the answer, and then the sweep pauses or releases it as
    it would have."""
    bracket = rungs.bracket_of(number)
    others = [t for t in trials if t.number != number and t.bracket == bracket]
    board = _Board(
        others,
        rungs,
        minimize,
        all_started=max(len(trials), number + 1) >= budget.max_trials,
        bracket=bracket,
    )
    bars: dict[int, float | None] = {}
    for rung in range(bracket, rungs.last):
        entries = board.at.get(rung, [])
        count = board.top_count(len(entries) + 1)
        if count == 0:
            continue
        bars[rung] = entries[count - 1][0] if count <= len(entries) else None
    return bars


def places(trials: Sequence[TrialView], *, minimize: bool) -> dict[int, float]:
    """Each running trial's place among the values recorded at its latest rung (in its
    bracket): 0 the best there, 1 the worst (0.5 alone). What preemption reads to spare
    the promising."""
    boards = _boards(trials, None, minimize, all_started=False)
    found: dict[int, float] = {}
    for trial in trials:
        if trial.state is not TrialState.RUNNING or not trial.values:
            continue
        entries = [number for _, number in boards[trial.bracket].at[max(trial.values)]]
        last = len(entries) - 1
        found[trial.number] = entries.index(trial.number) / last if last else 0.5
    return found


def _boards(
    trials: Sequence[TrialView], rungs: Rungs | None, minimize: bool, *, all_started: bool
) -> dict[int, _Board]:
    """Each bracket's board (every bracket has one, if empty)."""
    count = max([rungs.brackets if rungs else 1, *(t.bracket + 1 for t in trials)])
    return {
        b: _Board(
            [t for t in trials if t.bracket == b],
            rungs,
            minimize,
            all_started=all_started,
            bracket=b,
        )
        for b in range(count)
    }


def _best_paused(
    boards: dict[int, _Board], paused: Sequence[TrialView]
) -> tuple[TrialView, str] | None:
    """The paused trial to promote: highest rung first (whichever its bracket), then the
    best value there."""
    found = [
        c
        for b, board in boards.items()
        if (c := board.best_paused([t for t in paused if t.bracket == b])) is not None
    ]
    return max(found, key=lambda c: c[0].rung, default=None)


class _Board:
    """The objective values recorded at each rung of one bracket, best first."""

    def __init__(
        self,
        trials: Sequence[TrialView],
        rungs: Rungs | None,
        minimize: bool,
        *,
        all_started: bool,
        bracket: int = 0,
    ) -> None:
        self.rungs, self.minimize, self.bracket = rungs, minimize, bracket
        self.all_started = all_started  # no new trial will come: round the top share up
        self.at: dict[int, list[tuple[float, int]]] = {}
        for trial in trials:
            for rung, value in trial.values.items():
                self.at.setdefault(rung, []).append((value, trial.number))
        for entries in self.at.values():
            entries.sort(key=lambda e: (e[0] if minimize else -e[0], e[1]))

    def top(self, rung: int) -> list[int]:
        entries = self.at.get(rung, [])
        return [number for _, number in entries[: self.top_count(len(entries))]]

    def top_count(self, recorded: int) -> int:
        """How many of `recorded` values at a rung are its top share."""
        share = recorded / (self.rungs.factor if self.rungs else 1)
        return math.ceil(share) if self.all_started else math.floor(share)

    def promotable(self, number: int, rung: int) -> str | None:
        top = self.top(rung)
        if number not in top:
            return None
        return f"in the top {len(top)} of {len(self.at[rung])} at rung {rung}{self._where}"

    def not_top(self, rung: int) -> str:
        count = len(self.at.get(rung, []))
        steps = self.rungs.steps[rung] if self.rungs else 0
        return (
            f"paused at rung {rung} (step {steps}): not in the top "
            f"{len(self.top(rung))} of {count} recorded there{self._where}"
        )

    @property
    def _where(self) -> str:
        return f" in bracket {self.bracket}" if self.rungs and self.rungs.brackets > 1 else ""

    def best_paused(self, paused: Sequence[TrialView]) -> tuple[TrialView, str] | None:
        """The paused trial to promote: highest rung first, then the best value there."""
        by_rung = sorted(paused, key=lambda t: -t.rung)
        for trial in by_rung:
            if self.rungs is None or trial.rung >= self.rungs.last:
                continue
            top = self.top(trial.rung)
            if trial.number in top:
                candidates = [t for t in by_rung if t.rung == trial.rung and t.number in top]
                best = min(candidates, key=lambda t: top.index(t.number))
                why = self.promotable(best.number, best.rung)
                assert why is not None
                return best, why
        return None
