"""The built-in trainer's fields are declared by the wire model (`gangway.models.Builtin`),
which holds their defaults; the ranks' TrainSpec and ParallelPlan must take every one of
them, with the same default, and refuse anything else."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from gangway.models import Builtin
from workers.plan import ParallelPlan
from workers.trainer import KNOWN_KEYS, builtin_spec
from workers.training import TrainSpec

RANK_FIELDS = {f.name: f for f in (*fields(TrainSpec), *fields(ParallelPlan))}


def test_every_builtin_field_reaches_the_ranks() -> None:
    missing = set(Builtin.model_fields) - {"kind"} - set(RANK_FIELDS)
    assert not missing, f"Builtin fields the ranks never read: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(set(Builtin.model_fields) - {"kind"}))
def test_the_ranks_default_is_the_wire_models(name: str) -> None:
    rank_default = RANK_FIELDS[name].default
    if rank_default is MISSING:
        return  # no default on the rank side: it always comes from the wire
    assert rank_default == Builtin.model_fields[name].default, name


def test_a_key_the_trainer_does_not_know_is_refused() -> None:
    launch = {**Builtin().model_dump(), "checkpoint_dir": None}
    assert set(launch) <= KNOWN_KEYS
    builtin_spec(launch)
    with pytest.raises(ValueError, match="does not know learning_rat"):
        builtin_spec({**launch, "learning_rat": 0.1})
