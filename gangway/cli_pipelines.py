"""`gangway pipeline`: several jobs submitted together (`gangway submit --file` with a
pipeline file: `name` and `jobs`, each a job body whose `name` is its step name), their
steps' states, and cancelling what has not ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, print_table, run
from gangway.errors import validation_failed
from gangway.models import PipelineInfo, PipelineSubmit

pipeline_app = typer.Typer(help="Jobs submitted together as the named steps of a pipeline.")


def is_pipeline(body: Any) -> bool:
    """A file with a list of `jobs` is a pipeline; a job body has none."""
    return isinstance(body, dict) and isinstance(body.get("jobs"), list)


def pipeline_from(body: dict[str, Any], path: Path) -> PipelineSubmit:
    try:
        return PipelineSubmit.model_validate(body)
    except ValidationError as exc:
        echo(f"error: {path}: {validation_failed(exc)}", err=True)
        raise typer.Exit(1) from exc


def submit_pipeline(spec: PipelineSubmit, url: str, as_json: bool) -> None:
    with cli_shared.connect(url) as client:
        info = run(lambda: client.submit_pipeline(spec))
    print_pipeline(info, as_json)


@pipeline_app.command("status")
def status(pipeline_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """The pipeline's state and each step's job."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.pipeline(pipeline_id))
    print_pipeline(info, as_json)


@pipeline_app.command("cancel")
def cancel(pipeline_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Cancel every step that has not ended (those that ended keep their outcome)."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.cancel_pipeline(pipeline_id))
    print_pipeline(info, as_json)


def print_pipeline(info: PipelineInfo, as_json: bool) -> None:
    if as_json:
        echo_json(info.model_dump_json(indent=2))
        return
    echo(f"pipeline {info.id} {info.name!r}: {info.state.value} ({len(info.jobs)} steps)")
    print_table(
        [">JOB", "STEP", "STATE", "REASON"],
        ([job.id, job.name, job.state.value, job.status_reason] for job in info.jobs),
    )
