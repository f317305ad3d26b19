"""`gangway metrics`: what a job reported, step by step, and its objective's best value;
with `--samples`, the service's own samples of its progress (step time, memory,
communication)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, run
from gangway.models import MetricPoint, ObjectiveValue, ReportedValues, metric_order

# Columns shown without --name: the first of the job's names in `metric_order`.
DEFAULT_COLUMNS = 6

Names = Annotated[
    list[str] | None, typer.Option("--name", "-n", help="a metric to show (repeat for several)")
]
Last = Annotated[int, typer.Option(min=0, help="the newest N reports; 0: every one")]
Samples = Annotated[
    bool, typer.Option("--samples", help="the service's samples: step time, memory, comm")
]


def metrics(
    job_id: int,
    *,
    name: Names = None,
    last: Last = 20,
    samples: Samples = False,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """What a job reported (any metric, by step and attempt) and its objective's best; a
    job that reported nothing by name shows the service's samples."""
    with cli_shared.connect(url) as client:
        summary = run(lambda: client.metric_page(job_id, limit=1))
        if samples or not summary.names:
            _print_samples(run(lambda: client.metrics(job_id, max_points=max(last, 2))), as_json)
            return
        points = run(lambda: client.metric_points(job_id, name or ()))
    if as_json:
        cli_shared.echo_json(json.dumps([p.model_dump(mode="json") for p in points], indent=2))
        return
    objective = summary.objective.metric if summary.objective else None
    ordered = metric_order(summary.names, objective)
    columns = list(name) if name else ordered[:DEFAULT_COLUMNS]
    _print_reported(points[-last:] if last else points, columns)
    others = [n for n in ordered if n not in columns]
    if others:
        cli_shared.echo(f"also reported: {', '.join(others)} (--name to show)")
    if summary.objective is not None:
        cli_shared.echo(_best(summary.objective))


def _print_reported(points: list[ReportedValues], columns: list[str]) -> None:
    cli_shared.print_table(
        [">STEP", ">ATT", *(f">{c}" for c in columns)],
        ([p.step, p.attempt, *(_value(p.values.get(c)) for c in columns)] for p in points),
    )


def _best(best: ObjectiveValue) -> str:
    lowest = "lowest" if best.mode == "min" else "highest"
    return (
        f"best {best.metric} ({lowest}): {_value(best.value)} at step {best.step}, "
        f"attempt {best.attempt}"
    )


def _value(value: float | None) -> str:
    """Four significant figures at least, so a learning rate of 3e-05 is not 0.0000."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.5g}"


def _print_samples(points: list[MetricPoint], as_json: bool) -> None:
    if as_json:
        cli_shared.echo_json(json.dumps([p.model_dump(mode="json") for p in points], indent=2))
        return
    cli_shared.print_table(
        [">STEP", ">ATT", ">LOSS", ">TOKENS/S", ">STEP MS", ">MEM MB", ">COMM MS", ">COMM MB"],
        (
            [
                p.step,
                p.attempt,
                _num(p.loss, ".4f"),
                _num(p.tokens_per_s, ",.0f"),
                _num(p.step_time_s * 1000 if p.step_time_s is not None else None, ".0f"),
                _num(p.memory_mb, ".0f"),
                _num(p.comm_s * 1000 if p.comm_s is not None else None, ".0f"),
                _num(p.comm_bytes / 2**20 if p.comm_bytes is not None else None, ".2f"),
            ]
            for p in points
        ),
    )


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
