"""`gangway simulate`: run the chosen policies over one trace, print, save, plot."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
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
from scheduler.sim.policies import POLICIES, SimPolicy
from scheduler.sim.report import table_rows, write_json, write_plots
from scheduler.sim.trace import load_trace


def _advance(progress: Progress, task: TaskID, done: int) -> None:
    progress.update(task, completed=done)


def type_blind(policy: SimPolicy) -> SimPolicy:
    """The same policy placing every job as if the cluster had one GPU type (the
    baseline heterogeneity-aware placement is measured against)."""
    config = replace(policy.config, speed_aware_placement=False)
    return replace(policy, name=f"{policy.name}-type-blind", config=config)


def simulate_command(
    *,
    trace: Path,
    policies: list[str],
    limit: int | None,
    out: Path,
    cluster: dict[str, Any],
    blind_too: bool = False,
) -> None:
    """`blind_too`: run each policy also type-blind, right after it."""
    console = Console()
    if not console.is_terminal:  # a log or a pipe: keep the table readable, not squeezed
        console = Console(width=170)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policy {unknown}; known: {', '.join(POLICIES)}")
    try:
        config = SimConfig(**cluster)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
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
        chosen = [POLICIES[name] for name in policies or list(POLICIES)]
        if blind_too:
            chosen = [variant for p in chosen for variant in (p, type_blind(p))]
        for policy in chosen:
            task = progress.add_task(f"{policy.name:<14}", total=len(jobs))
            started = time.perf_counter()
            result = Simulator(jobs, config, policy).run(
                functools.partial(_advance, progress, task)
            )
            seconds[policy.name] = time.perf_counter() - started
            results.append(result)
            metrics.append(compute(result))
    types = " + ".join(f"{count} {name}" for name, count in config.node_types)
    shape = f"{config.nodes} x {config.gpus_per_node} GPUs" + (f" ({types})" if types else "")
    table = Table(title=f"{trace.name}: {len(jobs)} jobs, {shape}")
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
