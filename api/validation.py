"""Submit-time checks that a schema cannot express; each failure names its field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from api.errors import FieldError
from gangway.models import Builtin, Function, JobSubmit, Script
from gangway.requirement_lines import first_refused
from scheduler.core import missing_types_reason, never_fits_reason
from scheduler.model import JobSpec, Node
from scheduler.predict.steptime import StepPlan
from scheduler.runtime.launch import builtin_fields
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.plan import PlanError, plan_from_entrypoint, validate_plan
from workers.program.entrypoints import EntrypointError, check_function_target


def validate_submission(submit: JobSubmit, spec: JobSpec, nodes: Sequence[Node]) -> None:
    """`spec` is the submission as the service will read it (built once by the caller)."""
    _check_entrypoint(submit, spec)
    missing = missing_types_reason(spec.shape, nodes)
    if missing is not None:
        raise FieldError(
            "resources.gpu_types", f"this job can never run on this cluster: {missing}"
        )
    reason = never_fits_reason(spec.shape, nodes)
    if reason is not None:
        raise FieldError("parallelism", f"this job can never run on this cluster: {reason}")


def check_requirements(lines: Sequence[str], *, allow_pip_options: bool) -> None:
    """Requirement lines go to pip on every node as lines of a requirements file, where an
    option, URL or path installs code from wherever the submitter points: only plain
    requirements pass unless the admin allows pip's whole syntax."""
    if allow_pip_options:
        return
    refused = first_refused(lines)
    if refused is not None:
        index, why = refused
        raise FieldError(
            f"requirements.{index}",
            f"{why}; pip options, URLs and paths are taken only where the service's admin "
            "allows them (GANGWAY_REQUIREMENTS_ALLOW_PIP_OPTIONS)",
        )


def _check_plan(entrypoint: Builtin, spec: JobSpec) -> None:
    """The engine's own plan checks, before anything starts, on exactly what the ranks
    will receive. An elastic job is checked at its smallest and largest degree (the batch
    and sharding must work at both)."""
    shape = spec.shape
    degrees = {shape.dp_min or shape.parallelism.dp, shape.dp_max or shape.parallelism.dp}
    fields = builtin_fields(spec)
    tp, pp = shape.parallelism.tp, shape.parallelism.pp
    for dp in sorted(degrees):
        try:
            _engine_check(fields, entrypoint.model, (dp, tp, pp), entrypoint.batch_size)
        except PlanError as exc:
            raise FieldError(exc.field, exc.message) from exc


def runnable_plan(entrypoint: Builtin, plan: StepPlan) -> bool:
    """Whether the engine takes `entrypoint` at the degrees, microbatches and batch of
    `plan` (a candidate of `parallelism: auto`): the same check a submission gets."""
    fields = entrypoint.model_dump() | {"microbatches": plan.microbatches, "fsdp": plan.fsdp}
    try:
        _engine_check(fields, entrypoint.model, (plan.dp, plan.tp, plan.pp), plan.batch_size)
    except PlanError:
        return False
    return True


def _engine_check(
    fields: Mapping[str, Any], model: str, degrees: tuple[int, int, int], batch_size: int
) -> None:
    """The engine's `validate_plan` on a builtin entrypoint's plan fields at (dp, tp, pp);
    raises `PlanError`."""
    dp, tp, pp = degrees
    plan = plan_from_entrypoint(fields, dp=dp, tp=tp, pp=pp)
    validate_plan(plan, MODEL_CONFIGS[model], batch_size=batch_size)


def check_model(entrypoint: Builtin) -> None:
    """The built-in trainer knows the model (422 naming `entrypoint.model` if not)."""
    if entrypoint.model not in MODEL_CONFIGS:
        known = ", ".join(sorted(MODEL_CONFIGS))
        raise FieldError("entrypoint.model", f"unknown model {entrypoint.model!r}; known: {known}")


def _check_entrypoint(submit: JobSubmit, spec: JobSpec) -> None:
    entrypoint = submit.entrypoint
    if isinstance(entrypoint, Builtin):
        check_model(entrypoint)
        _check_plan(entrypoint, spec)
    elif submit.package is not None:
        return  # the code is in the job's working directory, which only the ranks unpack
    elif isinstance(entrypoint, Script):
        _check_script(entrypoint.path)
    elif isinstance(entrypoint, Function):
        try:
            check_function_target(entrypoint.target)
        except EntrypointError as exc:
            raise FieldError("entrypoint.target", str(exc)) from exc


def _check_script(path: str) -> None:
    try:
        found = Path(path).resolve().is_file()
    except OSError as exc:  # a name too long, a loop of links
        raise FieldError("entrypoint.path", f"cannot use {path!r}: {exc.strerror}") from exc
    if not found:
        raise FieldError("entrypoint.path", f"no such script: {path!r}")
