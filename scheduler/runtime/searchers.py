"""Where a sweep's next trial goes: a grid in order, or Optuna's random and TPE samplers.

Optuna is the well-kept library for search spaces and samplers; it is used here without
its storage or its optimisation loop. For each new trial an in-memory study is rebuilt from
the trials the store holds (each with its objective at every rung it reached: TPE ranks a
trial paused at a rung by its value there, as Optuna ranks pruned trials), and asked once,
with the sampler seeded by the sweep's seed and the trial's number: the same history gives
the same trial, so a seeded sweep run one trial at a time is reproduced exactly, and a
controller that asks again after a restart asks the same question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState as OptunaState
from optuna.trial import create_trial

from gangway.models import Choice, Dimension, IntRange, LogUniform, SweepSubmit, Uniform
from scheduler.core.asha import TrialState
from scheduler.store.sweeps import TrialRecord

# A grid sweep with no max_trials runs its every point: at most this many.
MAX_GRID_TRIALS = 1000


def grid_point(space: dict[str, Dimension], number: int) -> dict[str, Any]:
    """Combination `number` (modulo the grid's size), the last dimension fastest, found
    by mixed-radix digits: the grid itself is never built (it may be 10^9 points)."""
    axes = {name: _grid_values(dim) for name, dim in space.items()}
    point: dict[str, Any] = {}
    rest = number % grid_size(space)
    for name in reversed(list(axes)):
        rest, digit = divmod(rest, len(axes[name]))
        point[name] = axes[name][digit]
    return {name: point[name] for name in axes}


def grid_size(space: dict[str, Dimension]) -> int:
    return math.prod(len(_grid_values(dim)) for dim in space.values())


def _grid_values(dim: Dimension) -> list[Any]:
    if isinstance(dim, Choice):
        return list(dim.values)
    if isinstance(dim, IntRange):
        return list(range(dim.low, dim.high + 1, dim.step))
    if dim.points == 1:
        return [dim.low]
    if isinstance(dim, LogUniform):
        ratio = (dim.high / dim.low) ** (1 / (dim.points - 1))
        return [dim.low * ratio**i for i in range(dim.points - 1)] + [dim.high]
    width = (dim.high - dim.low) / (dim.points - 1)
    return [dim.low + width * i for i in range(dim.points - 1)] + [dim.high]


def trial_budget(sweep: SweepSubmit) -> int:
    """`max_trials`, or the grid's size for a grid, else 16."""
    if sweep.max_trials is not None:
        return sweep.max_trials
    return min(grid_size(sweep.space), MAX_GRID_TRIALS) if _is_grid(sweep) else 16


def _is_grid(sweep: SweepSubmit) -> bool:
    return sweep.searcher == "grid"


def suggest(
    sweep: SweepSubmit, number: int, history: Sequence[TrialRecord], rung_steps: Sequence[int]
) -> dict[str, Any]:
    """The parameters of trial `number` (0-based), given the trials so far."""
    if _is_grid(sweep):
        return grid_point(sweep.space, number)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {name: _distribution(dim) for name, dim in sweep.space.items()}
    seed = (sweep.seed * 1_000_003 + number) % 2**32
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.TPESampler(seed=seed)
        if sweep.searcher == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    minimize = sweep.objective is None or sweep.objective.mode == "min"
    study = optuna.create_study(sampler=sampler, direction="minimize" if minimize else "maximize")
    for trial in history:
        known = _known(trial, distributions, rung_steps)
        if known is not None:
            study.add_trial(known)
    return dict(study.ask(fixed_distributions=distributions).params)


def _distribution(dim: Dimension) -> BaseDistribution:
    if isinstance(dim, Uniform):
        return FloatDistribution(dim.low, dim.high)
    if isinstance(dim, LogUniform):
        return FloatDistribution(dim.low, dim.high, log=True)
    if isinstance(dim, IntRange):
        return IntDistribution(dim.low, dim.high, step=dim.step)
    return CategoricalDistribution(list(dim.values))


def _known(
    trial: TrialRecord, distributions: dict[str, BaseDistribution], rung_steps: Sequence[int]
) -> optuna.trial.FrozenTrial | None:
    """A trial as Optuna records one: finished with its value, pruned at its last rung
    (paused or stopped there), failed; one with no value yet tells nothing."""
    if trial.state is TrialState.FAILED:
        return create_trial(
            state=OptunaState.FAIL, params=trial.params, distributions=distributions
        )
    if not trial.values:
        return None
    steps = list(rung_steps) or [0]
    intermediate = {steps[min(rung, len(steps) - 1)]: v for rung, v in trial.values.items()}
    if trial.state is TrialState.COMPLETED:
        return create_trial(
            value=trial.values[max(trial.values)],
            params=trial.params,
            distributions=distributions,
            intermediate_values=intermediate,
        )
    return create_trial(
        state=OptunaState.PRUNED,
        params=trial.params,
        distributions=distributions,
        intermediate_values=intermediate,
    )
