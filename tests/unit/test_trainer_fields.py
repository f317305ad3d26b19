"""The built-in trainer's fields are declared by the wire model (`gangway.models.Builtin`,
with `Parallelism` and `CheckpointPolicy`), which holds their defaults; the ranks'
TrainSpec and ParallelPlan take every one of them, default them from the wire model
(`gangway.models.wire_default`), and refuse anything else."""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, fields, is_dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from gangway.models import Builtin, CheckpointPolicy, Instability, JobSubmit, Parallelism
from scheduler.runtime.launch import builtin_fields
from scheduler.store.specs import spec_from_json
from workers.engine.health import InstabilityPolicy
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


def rank_default_of(field: Field[Any]) -> Any:
    """A nested setting (`on_instability`) as a dict of its fields' defaults."""
    if field.default_factory is not MISSING:
        value = field.default_factory()
        return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
    return field.default


def wire_default_of(model: type[BaseModel], name: str) -> Any:
    value = model.model_fields[name].get_default(call_default_factory=True)
    return value.model_dump() if isinstance(value, BaseModel) else value


@pytest.mark.parametrize(("name", "model", "wire_name"), WIRE_FIELDS)
def test_the_ranks_default_is_the_wire_models(name: str, model: type, wire_name: str) -> None:
    rank_default = rank_default_of(RANK_FIELDS[name])
    assert rank_default is not MISSING, f"{name}: the ranks need the wire model's default"
    assert rank_default == wire_default_of(model, wire_name), name


def test_what_the_service_launches_is_all_known_to_the_trainer() -> None:
    spec = spec_from_json(JobSubmit(name="j", entrypoint=Builtin()).model_dump(mode="json"))
    fields = builtin_fields(spec)
    assert set(fields) <= KNOWN_KEYS
    assert builtin_spec(fields).checkpoint_interval_steps is None


def test_the_instability_policy_arrives_as_a_dict_and_is_converted() -> None:
    entry = Builtin(on_instability=Instability(action="skip", lr_scale=0.5))
    spec = spec_from_json(JobSubmit(name="j", entrypoint=entry).model_dump(mode="json"))
    policy = builtin_spec(builtin_fields(spec)).on_instability
    assert policy == InstabilityPolicy(action="skip", lr_scale=0.5)


def test_a_key_the_trainer_does_not_know_is_refused() -> None:
    spec = spec_from_json(JobSubmit(name="j", entrypoint=Builtin()).model_dump(mode="json"))
    launch = builtin_fields(spec)
    builtin_spec(launch)
    with pytest.raises(ValueError, match="does not know learning_rat"):
        builtin_spec({**launch, "learning_rat": 0.1})
