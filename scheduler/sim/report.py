"""Simulation output: a comparison table, a JSON result and PNG plots (matplotlib)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.sim.jobs import SimResult
from scheduler.sim.metrics import Metrics

COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("jct_avg_s", "JCT avg"),
    ("jct_median_s", "JCT p50"),
    ("jct_p95_s", "JCT p95"),
    ("jct_p99_s", "JCT p99"),
    ("wait_avg_s", "wait avg"),
    ("wait_p99_s", "wait p99"),
    ("longest_wait_s", "longest wait"),
    ("makespan_s", "makespan"),
    ("utilization", "util"),
    ("preemptions", "preempt"),
    ("lost_gpu_hours", "lost GPU-h"),
    ("jain_fairness", "Jain"),
    ("prediction_mdape", "pred MdAPE"),
    ("prediction_spearman", "pred rho"),
)


def table_rows(metrics: Sequence[Metrics]) -> list[list[str]]:
    """Header row, then one row per policy; times in hours."""
    rows = [[title for _, title in COLUMNS]]
    for m in metrics:
        values = m.as_dict()
        rows.append([_cell(key, values[key]) for key, _ in COLUMNS])
    return rows


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_s"):
        return f"{value / 3600:.2f} h"
    if key == "prediction_mdape":
        return f"{value:.0%}"
    if key in ("utilization", "jain_fairness", "prediction_spearman"):
        return f"{value:.3f}"
    if key == "lost_gpu_hours":
        return f"{value:.1f}"
    return str(value)


def write_json(path: Path, settings: dict[str, Any], metrics: Sequence[Metrics]) -> None:
    body = {"settings": settings, "policies": [m.as_dict() for m in metrics]}
    path.write_text(json.dumps(body, indent=2, default=str))


def write_plots(folder: Path, results: Sequence[SimResult]) -> list[Path]:
    """JCT CDF per policy; queue length and GPU utilization over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = sorted(
            (j.finish_s - j.trace.submit_s) / 3600 for j in result.jobs if j.finish_s is not None
        )
        axis.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=result.policy)
    axis.set_xscale("log")
    axis.set(xlabel="job completion time (h, log)", ylabel="fraction of jobs", title="JCT CDF")
    axis.legend()
    paths.append(_save(figure, folder / "jct_cdf.png"))
    for field, label, name in (
        ("queued_jobs", "jobs waiting", "queue_length.png"),
        ("busy_gpus", "GPUs allocated", "utilization.png"),
    ):
        figure, axis = plt.subplots(figsize=(7, 4.5))
        for result in results:
            times = [s.time_s / 3600 for s in result.samples]
            axis.plot(times, [getattr(s, field) for s in result.samples], label=result.policy)
        axis.set(xlabel="time (h)", ylabel=label, title=f"{label} over time")
        axis.legend()
        paths.append(_save(figure, folder / name))
    return paths


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path
