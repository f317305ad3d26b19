"""`gangway simulate`: run the chosen policies over one trace, print, save, plot."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from scheduler.sim.engine import Simulator
from scheduler.sim.jobs import SimConfig, SimResult
from scheduler.sim.metrics import Metrics, compute
from scheduler.sim.policies import POLICIES
from scheduler.sim.report import table_rows, write_json, write_plots
from scheduler.sim.trace import load_trace


def _advance(progress: Progress, task: TaskID, done: int) -> None:
    progress.update(task, completed=done)


def simulate_command(
    *, trace: Path, policies: list[str], limit: int | None, out: Path, cluster: dict[str, Any]
) -> None:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: keep the table readable, not squeezed
        console = Console(width=170)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policy {unknown}; known: {', '.join(POLICIES)}")
    config = SimConfig(**cluster)
    jobs = load_trace(trace, limit=limit)
    results: list[SimResult] = []
    metrics: list[Metrics] = []
    seconds: dict[str, float] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        for name in policies or list(POLICIES):
            task = progress.add_task(f"{name:<14}", total=len(jobs))
            started = time.perf_counter()
            result = Simulator(jobs, config, POLICIES[name]).run(
                functools.partial(_advance, progress, task)
            )
            seconds[name] = time.perf_counter() - started
            results.append(result)
            metrics.append(compute(result))
    table = Table(
        title=f"{trace.name}: {len(jobs)} jobs, {config.nodes} x {config.gpus_per_node} GPUs"
    )
    header, *rows = table_rows(metrics)
    for title in header:
        table.add_column(title, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for name, value in seconds.items():
        console.print(f"{name}: simulated in {value:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    settings = {"trace": str(trace), "jobs": len(jobs), **cluster, "seconds": seconds}
    write_json(out / "result.json", settings, metrics)
    for path in write_plots(out, results):
        console.print(f"wrote {path}")
    console.print(f"wrote {out / 'result.json'}")
