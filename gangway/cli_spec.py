"""A job body from the command line: `gangway submit` and `gangway estimate` take the
same flags and files, declared here once (`SpecFlags`, added to a command by
`with_spec_flags`), with their defaults read from the wire model."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

import typer
import yaml
from pydantic import ValidationError

from gangway.cli_shared import echo
from gangway.errors import validation_failed
from gangway.models import (
    Builtin,
    Command,
    Function,
    JobSubmit,
    Parallelism,
    Resources,
    wire_default,
)

NameOption = Annotated[str | None, typer.Option(help="job name (required without --file)")]
FileOption = Annotated[
    Path | None,
    typer.Option("--file", "-f", exists=True, dir_okay=False, help="a job spec in YAML or JSON"),
]
ModelOption = Annotated[str, typer.Option(help="built-in model")]
StepsOption = Annotated[int, typer.Option(help="training steps (built-in trainer)")]
FunctionOption = Annotated[
    str | None, typer.Option(help="run pkg.mod:fn instead of the built-in trainer")
]
KwargsOption = Annotated[str, typer.Option(help="JSON object of keyword arguments for --function")]
AutoOption = Annotated[
    bool,
    typer.Option(
        "--auto", help="let the service pick the plan that finishes soonest (built-in trainer)"
    ),
]
BudgetOption = Annotated[int | None, typer.Option(help="with --auto: at most this many GPUs")]
MixOption = Annotated[
    bool, typer.Option("--mix-gpu-types", help="let one gang span GPU types when it must")
]
GpuTypeOption = Annotated[
    list[str] | None,
    typer.Option("--gpu-type", help="a GPU type the ranks may run on (repeat); default: any"),
]
SettingsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="a built-in trainer field, key=value (repeatable): --set update_mode=local-sgd",
    ),
]


@dataclass(frozen=True)
class SpecFlags:
    """The flags that build a job body, for every command that takes one."""

    name: NameOption = None
    file: FileOption = None
    model: ModelOption = wire_default(Builtin, "model")
    steps: StepsOption = wire_default(Builtin, "steps")
    function: FunctionOption = None
    kwargs: KwargsOption = "{}"
    settings: SettingsOption = None
    dp: int = wire_default(Parallelism, "dp")
    tp: int = wire_default(Parallelism, "tp")
    pp: int = wire_default(Parallelism, "pp")
    gpus_per_rank: int = wire_default(Resources, "gpus_per_rank")
    priority: int = wire_default(JobSubmit, "priority")
    queue: str = wire_default(JobSubmit, "queue")
    max_restarts: int = wire_default(JobSubmit, "max_restarts")
    auto: AutoOption = False
    gpu_budget: BudgetOption = None
    gpu_type: GpuTypeOption = None
    mix_gpu_types: MixOption = False


def with_spec_flags(command: Callable[..., None]) -> Callable[..., None]:
    """A Typer command that takes `SpecFlags`' flags, besides its own, and receives them
    as its first argument, `flags`."""
    hints = get_type_hints(SpecFlags, include_extras=True)
    shared = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
        )
        for f in fields(SpecFlags)
    ]
    own = inspect.signature(command, eval_str=True)
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()]
    rest = [p for p in rest if p.name != "flags"]

    @functools.wraps(command)
    def wrapper(**given: Any) -> None:
        flags = SpecFlags(**{f.name: given.pop(f.name) for f in fields(SpecFlags)})
        command(flags, **given)

    parameters = [*shared, *rest]
    wrapper.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return wrapper


def job_spec(
    flags: SpecFlags, *, command: list[str] | None = None, workdir: Path | None = None
) -> JobSubmit:
    """From a job file (the REST body, as YAML or JSON; --name overrides its name), or
    from the flags: `command` (after --) runs on every rank, named after `workdir`."""
    if flags.file is not None:
        return spec_from_file(flags.file, flags.name)
    if flags.name is None and not command:
        echo("error: give --name, or a job file with --file", err=True)
        raise typer.Exit(2)
    entrypoint: Builtin | Function | Command = (
        Command(argv=command)
        if command
        else Function(target=flags.function, kwargs=json.loads(flags.kwargs))
        if flags.function
        else builtin(flags.model, flags.steps, flags.settings or [])
    )
    parallelism: Parallelism | Literal["auto"] = (
        "auto" if flags.auto else Parallelism(dp=flags.dp, tp=flags.tp, pp=flags.pp)
    )
    try:
        return JobSubmit(
            name=flags.name or (workdir or Path.cwd()).resolve().name,
            priority=flags.priority,
            queue=flags.queue,
            parallelism=parallelism,
            gpu_budget=flags.gpu_budget,
            resources=Resources(
                gpus_per_rank=flags.gpus_per_rank,
                gpu_types=flags.gpu_type,
                mix_gpu_types=flags.mix_gpu_types,
            ),
            entrypoint=entrypoint,
            max_restarts=flags.max_restarts,
        )
    except ValidationError as exc:  # a flag's value the wire model refuses: name it
        echo(f"error: {validation_failed(exc)}", err=True)
        raise typer.Exit(2) from None


def _string_keys(value: Any) -> Any:
    """YAML 1.1 reads a bare `on` or `off` as a boolean, keys too: `depends_on: [{job: 3,
    on: ended}]` would say `True: ended`. A body's keys are names (JSON has no other), so
    a boolean key is the word it was written as; values keep YAML's booleans (`yes`)."""
    if isinstance(value, list):
        return [_string_keys(item) for item in value]
    if isinstance(value, dict):
        words = {True: "on", False: "off"}
        return {(words[k] if isinstance(k, bool) else k): _string_keys(v) for k, v in value.items()}
    return value


def read_body(path: Path) -> Any:
    """A job, pipeline or sweep file. YAML is a superset of JSON: one loader reads both."""
    try:
        return _string_keys(yaml.safe_load(path.read_text()))
    except yaml.YAMLError as exc:
        echo(f"error: {path} is not YAML or JSON: {exc}", err=True)
        raise typer.Exit(1) from exc


def spec_from_file(path: Path, name: str | None) -> JobSubmit:
    body = read_body(path)
    if name is not None and isinstance(body, dict):
        body["name"] = name
    try:
        return JobSubmit.model_validate(body)
    except ValidationError as exc:
        echo(f"error: {path}: {validation_failed(exc)}", err=True)
    raise typer.Exit(1)


def builtin(model: str, steps: int, settings: list[str]) -> Builtin:
    """The built-in trainer from flags and `--set key=value` pairs (a value is read as
    JSON when it parses, else as text); a bad key or value exits 2 naming it."""
    fields: dict[str, Any] = {"model": model, "steps": steps}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key:
            echo(f"error: --set {item!r}: expected key=value", err=True)
            raise typer.Exit(2)
        try:
            fields[key] = json.loads(text)
        except json.JSONDecodeError:
            fields[key] = text
    try:
        return Builtin.model_validate(fields)
    except ValidationError as error:
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"])
            echo(f"error: --set {where}: {problem['msg']}", err=True)
        raise typer.Exit(2) from None
