"""The built-in trainer's fields are declared by the wire model (`gangway.models.Builtin`,
with `Parallelism` and `CheckpointPolicy`), which holds their defaults; the ranks'
TrainSpec and ParallelPlan take every one of them, default them from the wire model
(`gangway.models.wire_default`), and refuse anything else."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from gangway.models import Builtin, CheckpointPolicy, JobSubmit, Parallelism
from scheduler.runtime.launch import builtin_fields
from scheduler.store.specs import spec_from_json
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec
from workers.program.trainer import KNOWN_KEYS, builtin_spec

RANK_FIELDS = {f.name: f for f in (*fields(TrainSpec), *fields(ParallelPlan))}


def test_every_builtin_field_reaches_the_ranks() -> None:
    missing = set(Builtin.model_fields) - {"kind"} - set(RANK_FIELDS)
    assert not missing, f"Builtin fields the ranks never read: {sorted(missing)}"


# (rank-side field, wire model, wire field): every job-spec field the ranks take.
WIRE_FIELDS = [
    *((name, Builtin, name) for name in sorted(set(Builtin.model_fields) - {"kind"})),
    *((name, Parallelism, name) for name in ("dp", "tp", "pp", "fsdp")),
    ("checkpoint_interval_steps", CheckpointPolicy, "interval_steps"),
    ("keep_last", CheckpointPolicy, "keep_last"),
]


@pytest.mark.parametrize(("name", "model", "wire_name"), WIRE_FIELDS)
def test_the_ranks_default_is_the_wire_models(name: str, model: type, wire_name: str) -> None:
    rank_default = RANK_FIELDS[name].default
    assert rank_default is not MISSING, f"{name}: the ranks need the wire model's default"
    assert rank_default == model.model_fields[wire_name].default, name


def test_what_the_service_launches_is_all_known_to_the_trainer() -> None:
    spec = spec_from_json(JobSubmit(name="j", entrypoint=Builtin()).model_dump(mode="json"))
    fields = builtin_fields(spec)
    assert set(fields) <= KNOWN_KEYS
    assert builtin_spec(fields).checkpoint_interval_steps is None


def test_a_key_the_trainer_does_not_know_is_refused() -> None:
    spec = spec_from_json(JobSubmit(name="j", entrypoint=Builtin()).model_dump(mode="json"))
    launch = builtin_fields(spec)
    builtin_spec(launch)
    with pytest.raises(ValueError, match="does not know learning_rat"):
        builtin_spec({**launch, "learning_rat": 0.1})
