"""The stored job spec (the submitted body as JSON) -> the typed `JobSpec`.

The one place below the API that reads the spec by key. The body was stored as
`JobSubmit.model_dump`, which writes each default; a row stored before a field existed
takes that field's default from the wire model, so no default is restated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from gangway.models import Builtin, Command, Function, JobSubmit, Script
from scheduler.model import (
    BUILTIN_OBJECTIVE,
    BuiltinEntrypoint,
    CheckpointInit,
    CheckpointSpec,
    CodeSpec,
    CommandEntrypoint,
    EntrypointSpec,
    FunctionEntrypoint,
    GangShape,
    JobSpec,
    ModelInit,
    ObjectiveSpec,
    Parallelism,
    ScriptEntrypoint,
)


def spec_from_json(stored: Mapping[str, Any]) -> JobSpec:
    data = _merged(_DEFAULTS, stored)
    parallelism, resources = data["parallelism"], data["resources"]
    tp, pp, dp = int(parallelism["tp"]), int(parallelism["pp"]), parallelism["dp"]
    elastic = isinstance(dp, Mapping)
    shape = GangShape(
        parallelism=Parallelism(dp=int(dp["max"] if elastic else dp), tp=tp, pp=pp),
        gpus_per_rank=int(resources["gpus_per_rank"]),
        cpus_per_rank=float(resources["cpus_per_rank"]),
        dp_min=int(dp["min"]) if elastic else None,
        dp_max=int(dp["max"]) if elastic else None,
        gpu_types=frozenset(types) if (types := resources.get("gpu_types")) else None,
        mix_gpu_types=bool(resources.get("mix_gpu_types")),
    )
    limit = data["time_limit_s"]
    checkpoint = data["checkpoint"]
    entrypoint = _entrypoint(data["entrypoint"])
    return JobSpec(
        shape=shape,
        fsdp=bool(parallelism["fsdp"]),
        entrypoint=entrypoint,
        max_restarts=int(data["max_restarts"]),
        time_limit_s=float(limit) if limit is not None else None,
        preemptible=bool(data["preemptible"]),
        checkpoint=CheckpointSpec(
            interval_steps=checkpoint["interval_steps"], keep_last=int(checkpoint["keep_last"])
        ),
        code=CodeSpec(
            package=data["package"],
            requirements=tuple(data["requirements"]),
            env=dict(data["env"]),
            secrets=dict(data["secrets"]),
        ),
        objective=_objective(data["objective"], entrypoint),
        init_from=_init_from(data["init_from"]),
        # a pipeline step's names are ids once stored (`with_step_ids`)
        inputs_from=tuple(job for job in data.get("inputs_from", []) if isinstance(job, int)),
    )


def with_step_ids(body: dict[str, Any], ids: Mapping[str, int]) -> dict[str, Any]:
    """A pipeline step's body with the earlier steps it names (by step name, in
    `depends_on`, `init_from` and `inputs_from`) named by their job ids. A name not in `ids` is an
    error: the API checks that every name is an earlier step's."""
    out = dict(body)
    out["depends_on"] = [
        {**dep, "job": _step_id(dep["job"], ids)} for dep in body.get("depends_on", [])
    ]
    init = body.get("init_from")
    if isinstance(init, dict) and "job" in init:
        out["init_from"] = {**init, "job": _step_id(init["job"], ids)}
    out["inputs_from"] = [_step_id(job, ids) for job in body.get("inputs_from", [])]
    return out


def _step_id(job: int | str, ids: Mapping[str, int]) -> int:
    if isinstance(job, int):
        return job
    if job not in ids:
        raise ValueError(f"{job!r} is not an earlier step of the pipeline")
    return ids[job]


def _init_from(stored: Mapping[str, Any] | None) -> ModelInit | CheckpointInit | None:
    """A stored job names a model version by number (an alias is resolved at submit) and
    a job by id (a pipeline's step names are resolved at submit)."""
    if stored is None:
        return None
    if isinstance(stored.get("job"), int):
        step = stored.get("step")
        return CheckpointInit(int(stored["job"]), int(step) if step is not None else None)
    if isinstance(stored.get("version"), int):
        return ModelInit(str(stored["model"]), int(stored["version"]))
    return None


def _objective(
    stored: Mapping[str, Any] | None, entrypoint: EntrypointSpec
) -> ObjectiveSpec | None:
    """The declared objective; a built-in trainer job without one keeps its validation
    loss (the metric its trainer reports on the held-out split)."""
    if stored is not None:
        return ObjectiveSpec(metric=str(stored["metric"]), mode=str(stored.get("mode", "min")))
    return BUILTIN_OBJECTIVE if isinstance(entrypoint, BuiltinEntrypoint) else None


def _entrypoint(stored: Mapping[str, Any]) -> EntrypointSpec:
    kind = stored["kind"]
    data = _merged(_ENTRYPOINT_DEFAULTS.get(kind, {}), stored)
    if kind == "builtin":
        return BuiltinEntrypoint(settings={k: v for k, v in data.items() if k != "kind"})
    if kind == "function":
        return FunctionEntrypoint(target=data["target"], kwargs=dict(data["kwargs"]))
    if kind == "script":
        return ScriptEntrypoint(path=data["path"], args=tuple(data["args"]))
    if kind == "command":
        return CommandEntrypoint(argv=tuple(data["argv"]))
    raise ValueError(f"unknown entrypoint kind {kind!r}")


# Every default, as the wire model writes it (the entrypoint's come with its kind; the
# write-only secrets, which no dump writes, are stored only when a job has some).
_DEFAULTS = {
    **JobSubmit(name="-", entrypoint=Builtin()).model_dump(mode="json"),
    "secrets": {},
    "entrypoint": {},
}


def _optional_fields(model: type[BaseModel]) -> dict[str, Any]:
    """Each optional field's default as JSON would hold it (a nested model as a dict)."""
    defaults = {
        name: field.get_default(call_default_factory=True)
        for name, field in model.model_fields.items()
        if not field.is_required()
    }
    return {
        name: value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        for name, value in defaults.items()
    }


_ENTRYPOINT_DEFAULTS = {
    model.model_fields["kind"].default: _optional_fields(model)
    for model in (Builtin, Function, Script, Command)
}


def _merged(defaults: Mapping[str, Any], stored: Mapping[str, Any]) -> dict[str, Any]:
    """`stored` over `defaults`, nested mappings merged key by key."""
    merged = dict(defaults)
    for key, value in stored.items():
        default = defaults.get(key)
        both = isinstance(default, Mapping) and isinstance(value, Mapping)
        merged[key] = _merged(default, value) if both else value  # type: ignore[arg-type]
    return merged
