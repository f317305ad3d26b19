"""The built-in entrypoint: the job spec's builtin fields -> a parallel plan and a training
spec -> `workers.engine.training.train` on the rank's process group.

The executor adds what only the service knows to the entrypoint it hands the ranks: the
FSDP switch from `parallelism` and the job's checkpoint directory and policy. A job that
is preempted or restarted finds its newest checkpoint there and resumes from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from gangway.models import PauseBar
from workers.engine.health import InstabilityPolicy
from workers.engine.plan import ParallelPlan, plan_from_entrypoint
from workers.engine.training import TrainSpec, train
from workers.program.context import RankContext

_SPEC_KEYS = {f.name for f in fields(TrainSpec)}
KNOWN_KEYS = _SPEC_KEYS | {f.name for f in fields(ParallelPlan)}


def builtin_spec(trainer_fields: Mapping[str, Any]) -> TrainSpec:
    """The training spec from the launch's trainer fields (`BuiltinRun.fields`). A name
    neither the spec nor the plan knows is an error, not dropped: a field added to
    `gangway.models.Builtin` and not plumbed through would otherwise be ignored silently
    on every rank. `on_instability` and `pause_unless` arrive as plain dicts."""
    unknown = sorted(set(trainer_fields) - KNOWN_KEYS)
    if unknown:
        raise ValueError(f"the built-in trainer does not know {', '.join(unknown)}")
    values = {k: v for k, v in trainer_fields.items() if k in _SPEC_KEYS}
    if "on_instability" in values:
        values["on_instability"] = InstabilityPolicy(**values["on_instability"])
    if "pause_unless" in values:
        values["pause_unless"] = [PauseBar.model_validate(b) for b in values["pause_unless"]]
    return TrainSpec(**values)


def train_builtin(ctx: RankContext, trainer_fields: Mapping[str, Any]) -> dict[str, Any]:
    info = ctx.info
    plan = plan_from_entrypoint(trainer_fields, dp=info.dp, tp=info.tp, pp=info.pp)
    spec = builtin_spec(trainer_fields)
    result = train(
        ctx,
        plan,
        spec,
        checkpoint_dir=ctx.checkpoint_dir,
        own_checkpoint_dir=ctx.own_checkpoint_dir,
        init_dir=ctx.model_dir,
    )
    return {"step": result.step, "resumed_from": result.resumed_from}
