"""A job's `init_from`, checked and pinned at submit: the caller must be able to read the
model (else the 422 names `init_from` and says no more than that it found none), the
version must train the same model as the job, and an alias is replaced by the version
number it points at, so the stored job says exactly what it started from (its lineage)."""

from __future__ import annotations

from api.auth import Principal
from api.errors import FieldError
from gangway.models import Builtin, JobSubmit, ModelRef, wire_default
from scheduler.store.registry import ModelNotFound, ModelRegistry


def pinned_init_from(submit: JobSubmit, caller: Principal, registry: ModelRegistry) -> JobSubmit:
    ref = submit.init_from
    if not isinstance(ref, ModelRef):  # none, or a job's checkpoint (api.dependency_checks)
        return submit
    try:
        model = registry.model(ref.model)
        if not model.readable_by(caller):
            raise ModelNotFound(ref.model)
        version = registry.version(ref.model, str(ref.version))
    except ModelNotFound as exc:
        message = f"no version {ref.version} of a model {ref.model!r} that {caller.name} may read"
        raise FieldError("init_from", message) from exc
    trained = _builtin_model(version.spec.get("entrypoint", {}))
    wanted = _builtin_model(submit.entrypoint.model_dump())
    if trained is not None and wanted is not None and trained != wanted:
        raise FieldError(
            "init_from",
            f"{ref.model} v{version.version} is a {trained}; this job trains a {wanted}",
        )
    pinned = ModelRef(model=ref.model, version=version.version)
    return submit.model_copy(update={"init_from": pinned})


def _builtin_model(entrypoint: dict[str, object]) -> str | None:
    """The built-in trainer's model name, or None for another kind of job."""
    if entrypoint.get("kind") != "builtin":
        return None
    return str(entrypoint.get("model") or wire_default(Builtin, "model"))
