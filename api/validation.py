"""Submit-time checks that a schema cannot express; each failure names its field."""

from __future__ import annotations

from collections.abc import Sequence

from api.errors import FieldError
from gangway.models import Builtin, Function, JobSubmit
from scheduler.core import never_fits_reason
from scheduler.model import GangShape, Node
from workers.entrypoints import EntrypointError, resolve_function
from workers.model_configs import MODEL_CONFIGS


def validate_submission(submit: JobSubmit, shape: GangShape, nodes: Sequence[Node]) -> None:
    """`shape` is the submission's gang (the caller derives it once from the spec)."""
    _check_entrypoint(submit)
    reason = never_fits_reason(shape, nodes)
    if reason is not None:
        raise FieldError("parallelism", f"this job can never run on this cluster: {reason}")


def _check_entrypoint(submit: JobSubmit) -> None:
    entrypoint = submit.entrypoint
    if isinstance(entrypoint, Builtin):
        if entrypoint.model not in MODEL_CONFIGS:
            known = ", ".join(sorted(MODEL_CONFIGS))
            raise FieldError(
                "entrypoint.model", f"unknown model {entrypoint.model!r}; known: {known}"
            )
        for axis in ("tp", "pp"):
            if getattr(submit.parallelism, axis) != 1:
                raise FieldError(
                    f"parallelism.{axis}",
                    f"the built-in trainer runs data parallel only for now; {axis} must be 1 "
                    "(use a function entrypoint for tensor or pipeline parallel code)",
                )
    elif isinstance(entrypoint, Function):
        try:
            resolve_function(entrypoint.target)
        except EntrypointError as exc:
            raise FieldError("entrypoint.target", str(exc)) from exc
