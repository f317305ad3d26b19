"""`gangway sweep`: a search over a job's fields whose trials are ordinary jobs. `gangway
sweep --file sweep.yaml` starts one (the REST body: name, base, space, searcher,
early_stopping, max_trials, max_concurrent, seed); `show` prints its trials and best
parameters; `cancel` ends it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, print_table, run
from gangway.cli_spec import read_body
from gangway.errors import validation_failed
from gangway.models import SweepInfo, SweepSubmit

sweep_app = typer.Typer(
    help="Hyperparameter sweeps: trials are jobs, stopped early by ASHA or Hyperband."
)


@sweep_app.callback(invoke_without_command=True)
def sweep(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="the sweep (YAML or JSON)")
    ] = None,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """Start a sweep from a file (as `gangway sweep --file sweep.yaml`)."""
    if ctx.invoked_subcommand is not None:
        return
    if file is None:
        echo("error: give --file sweep.yaml, or a command (show, cancel)", err=True)
        raise typer.Exit(2)
    try:
        spec = SweepSubmit.model_validate(read_body(file))
    except ValidationError as exc:
        echo(f"error: {file}: {validation_failed(exc)}", err=True)
        raise typer.Exit(1) from exc
    with cli_shared.connect(url) as client:
        info = run(lambda: client.submit_sweep(spec))
    print_sweep(info, as_json)


@sweep_app.command("show")
def show(sweep_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Every trial (parameters, objective, state, GPU-seconds) and the best one's job body."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.sweep(sweep_id))
    print_sweep(info, as_json)


@sweep_app.command("cancel")
def cancel(sweep_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """End the sweep and cancel every trial that has not ended."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.cancel_sweep(sweep_id))
    print_sweep(info, as_json)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in params.items()
    )


def print_sweep(info: SweepInfo, as_json: bool) -> None:
    if as_json:
        echo_json(info.model_dump_json(indent=2))
        return
    objective = (
        f"{info.objective.metric} ({'lowest' if info.objective.mode == 'min' else 'highest'})"
    )
    echo(
        f"sweep {info.id} {info.name!r}: {info.state} ({info.reason}); {info.searcher}, "
        f"{len(info.trials)}/{info.max_trials} trials, objective {objective}, "
        f"{info.gpu_seconds:,.0f} GPU-seconds"
    )
    hyperband = info.early_stopping == "hyperband"
    if info.rung_steps:
        echo(f"  {info.early_stopping} rungs at steps {', '.join(map(str, info.rung_steps))}")
    print_table(
        [">#", ">JOB", "STATE", ">STEP", ">OBJECTIVE", ">GPU-S", "PARAMETERS"],
        (
            [
                t.number,
                t.job_id,
                f"{t.state} (bracket {t.bracket})" if hyperband else t.state,
                t.step,
                f"{t.objective:.5g}" if t.objective is not None else "-",
                f"{t.gpu_seconds:,.0f}",
                ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in t.params.items()
                ),
            ]
            for t in info.trials
        ),
    )
    if info.best is not None:
        echo(f"best: trial {info.best.trial}, {info.objective.metric} {info.best.value:.6g}")
        echo(json.dumps(info.best.job.model_dump(mode="json"), indent=2))
