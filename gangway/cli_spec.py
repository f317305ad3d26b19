"""A job body from the command line: `gangway submit` and `gangway estimate` take the
same flags and files, built here once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml
from pydantic import ValidationError

from gangway.errors import validation_failed
from gangway.models import Builtin, Command, Function, JobSubmit, Parallelism, Resources

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
SettingsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="a built-in trainer field, key=value (repeatable): --set update_mode=local-sgd",
    ),
]


def job_spec(  # one argument per command-line flag
    *,
    file: Path | None,
    name: str | None,
    model: str,
    steps: int,
    function: str | None,
    kwargs: str,
    dp: int,
    tp: int,
    pp: int,
    gpus_per_rank: int,
    priority: int,
    queue: str,
    max_restarts: int,
    auto: bool,
    gpu_budget: int | None,
    settings: list[str] | None = None,
    command: list[str] | None = None,
    workdir: Path | None = None,
) -> JobSubmit:
    """From a job file (the REST body, as YAML or JSON; --name overrides its name), or
    from the flags: `command` (after --) runs on every rank, named after `workdir`."""
    if file is not None:
        return spec_from_file(file, name)
    if name is None and not command:
        typer.echo("error: give --name, or a job file with --file", err=True)
        raise typer.Exit(2)
    entrypoint: Builtin | Function | Command = (
        Command(argv=command)
        if command
        else Function(target=function, kwargs=json.loads(kwargs))
        if function
        else builtin(model, steps, settings or [])
    )
    parallelism: Parallelism | Literal["auto"] = (
        "auto" if auto else Parallelism(dp=dp, tp=tp, pp=pp)
    )
    return JobSubmit(
        name=name or (workdir or Path.cwd()).resolve().name,
        priority=priority,
        queue=queue,
        parallelism=parallelism,
        gpu_budget=gpu_budget,
        resources=Resources(gpus_per_rank=gpus_per_rank),
        entrypoint=entrypoint,
        max_restarts=max_restarts,
    )


def spec_from_file(path: Path, name: str | None) -> JobSubmit:
    """YAML is a superset of JSON: one loader reads both."""
    try:
        body = yaml.safe_load(path.read_text())
        if name is not None and isinstance(body, dict):
            body["name"] = name
        return JobSubmit.model_validate(body)
    except yaml.YAMLError as exc:
        typer.echo(f"error: {path} is not YAML or JSON: {exc}", err=True)
    except ValidationError as exc:
        typer.echo(f"error: {path}: {validation_failed(exc)}", err=True)
    raise typer.Exit(1)


def builtin(model: str, steps: int, settings: list[str]) -> Builtin:
    """The built-in trainer from flags and `--set key=value` pairs (a value is read as
    JSON when it parses, else as text); a bad key or value exits 2 naming it."""
    fields: dict[str, Any] = {"model": model, "steps": steps}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --set {item!r}: expected key=value", err=True)
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
            typer.echo(f"error: --set {where}: {problem['msg']}", err=True)
        raise typer.Exit(2) from None
