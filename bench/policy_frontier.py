"""A policy against 2D-LAS and strict FIFO on every shared trace: issue 30's four goals.

For each trace, one run of the chosen policy (the default, `gangway`, unless named),
with any `PolicyConfig` knob overridden, and one run each of `tiresias` (2D-LAS) and
`fifo`, all with the simulator's defaults and consolidated placement. It prints the
policy's ratios to 2D-LAS on average JCT, p99 wait, longest total wait and GPU-hours
lost to preemption (each goal: <= 1.000), the preemptions of both, the longest wait
over twice strict FIFO's (the stretch goal: <= 1), and on how many traces all four
goals are met.

    python bench/policy_frontier.py                      # the default, every trace
    python bench/policy_frontier.py --policy tiresias \\
        --set service_preemption_loss_s=300 --set min_runtime_s=600
    python bench/policy_frontier.py --only cluster10 --only cluster01
    python bench/policy_frontier.py --trace /data/other.csv:12   # a held-out trace

Baselines are cached under `--cache` (default ~/.cache/gangway-frontier), keyed by the
trace's bytes, the cluster, the baseline's config and the simulator's and core's
source, so a change to the policy reruns only the policy; a change to the core reruns
everything. Simulations run `--procs` at a time (default 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"
# Nodes of 8 GPUs per shared trace (BENCHMARKS.md, issue 30's table): Philly 12 or 16;
# ITP about 1.3x the trace's mean busy GPUs, raised to fit its largest job.
NODES = {
    "philly/philly_500": 16,
    "philly/philly_2000": 12,
    "philly/philly_le8_2000": 16,
    "itp/cluster01": 8,
    "itp/cluster03": 23,
    "itp/cluster05": 2,
    "itp/cluster06": 15,
    "itp/cluster07": 42,
    "itp/cluster08": 11,
    "itp/cluster09": 6,
    "itp/cluster10": 2,
}
GOALS = ("jct_avg_s", "wait_p99_s", "longest_wait_s", "lost_gpu_hours")
KEPT = (*GOALS, "preemptions")
Run = tuple[Path, int, str, dict[str, Any]]  # trace, nodes, policy, knobs overridden


def main() -> None:
    args = _parser().parse_args()
    traces = _traces(args)
    overrides = dict(_override(text) for text in args.set)
    cache = Path(args.cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = [
        (path, nodes, name, {}) for path, nodes in traces for name in ("tiresias", "fifo")
    ]
    runs = [run for run in runs if _cached(cache, *run) is None]
    runs += [(path, nodes, args.policy, overrides) for path, nodes in traces]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.procs) as pool:
        results = list(pool.map(_simulate, runs))
    measured: dict[Path, dict[str, Any]] = {}
    for (path, nodes, name, knobs), figures in zip(runs, results, strict=True):
        if knobs or name == args.policy:
            measured[path] = figures
        if not knobs:
            _cache_path(cache, path, nodes, name).write_text(json.dumps(figures))
    print(f"{args.policy} {overrides or ''} against tiresias (2D-LAS) and fifo")
    print(
        f"{'trace':<16} {'JCT':>6} {'p99':>6} {'longest':>8} {'lost':>6}"
        f" {'preemptions':>13} {'long/2FIFO':>10}  missed"
    )
    met = 0
    for path, nodes in traces:
        las = _cached(cache, path, nodes, "tiresias", {})
        fifo = _cached(cache, path, nodes, "fifo", {})
        assert las is not None and fifo is not None
        mine = measured[path]
        ratios = [_ratio(mine[key], las[key]) for key in GOALS]
        missed = [key for key, ratio in zip(GOALS, ratios, strict=True) if ratio > 1.0]
        met += not missed
        stretch = mine["longest_wait_s"] / (2 * fifo["longest_wait_s"])
        print(
            f"{path.stem:<16} "
            + " ".join(f"{r:6.3f}" if i != 2 else f"{r:8.3f}" for i, r in enumerate(ratios))
            + f" {mine['preemptions']:>6}/{las['preemptions']:<6} {stretch:10.2f}  "
            + (", ".join(missed) or "none")
        )
    print(
        f"all four goals met on {met} of {len(traces)} traces "
        f"({time.perf_counter() - started:.0f} s)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="gangway", help="a `gangway simulate` policy")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="override a PolicyConfig knob of the policy (repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="a shared trace by name, e.g. cluster10 (repeatable; default: all)",
    )
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="PATH:NODES",
        help="another trace and its nodes of 8 GPUs (repeatable)",
    )
    parser.add_argument("--shared", default=str(SHARED_TRACES), help="the shared traces' folder")
    parser.add_argument("--cache", default="~/.cache/gangway-frontier")
    parser.add_argument("--procs", type=int, default=2)
    return parser


def _traces(args: argparse.Namespace) -> list[tuple[Path, int]]:
    """The shared traces (all, or those named by --only; none when only --trace is
    given), then the --trace ones."""
    names = [Path(name).name for name in NODES]
    unknown = set(args.only) - set(names)
    if unknown:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: known: {', '.join(names)}")
    chosen = []
    if args.only or not args.trace:
        chosen = [
            (Path(args.shared) / f"{name}.csv", nodes)
            for name, nodes in NODES.items()
            if not args.only or Path(name).name in args.only
        ]
    for text in args.trace:
        path, _, nodes = text.rpartition(":")
        if not path or not nodes.isdigit():
            raise SystemExit(f"--trace {text!r}: expected PATH:NODES")
        chosen.append((Path(path), int(nodes)))
    return chosen


def _override(text: str) -> tuple[str, Any]:
    """`knob=value`, parsed as the type of the knob's default (tuples: comma-separated)."""
    from scheduler.core import PolicyConfig

    name, sep, value = text.partition("=")
    defaults = {f.name: f.default for f in dataclasses.fields(PolicyConfig)}
    if not sep or name not in defaults:
        raise SystemExit(f"--set {text!r}: expected KNOB=VALUE with a PolicyConfig knob")
    default = defaults[name]
    if isinstance(default, bool):
        return name, value.lower() in ("1", "true", "yes", "on")
    if isinstance(default, tuple):
        return name, tuple(float(v) for v in value.split(",") if v)
    if isinstance(default, int | float | str):
        return name, type(default)(value)
    raise SystemExit(f"--set {text!r}: {name} cannot be set from the command line")


def _simulate(run: Run) -> dict[str, Any]:
    from scheduler.sim.engine import Simulator
    from scheduler.sim.jobs import SimConfig
    from scheduler.sim.metrics import compute
    from scheduler.sim.policies import POLICIES
    from scheduler.sim.trace import load_trace

    path, nodes, name, overrides = run
    policy = POLICIES[name]
    if overrides:
        policy = dataclasses.replace(policy, config=dataclasses.replace(policy.config, **overrides))
    config = SimConfig(nodes=nodes, gpus_per_node=8, nodes_per_rack=4)
    metrics = compute(Simulator(load_trace(path), config, policy).run())
    return {key: getattr(metrics, key) for key in KEPT}


def _ratio(mine: float, theirs: float) -> float:
    if theirs:
        return mine / theirs
    return 0.0 if not mine else float("inf")


def _cached(
    cache: Path, path: Path, nodes: int, name: str, overrides: dict[str, Any]
) -> dict[str, Any] | None:
    if overrides:
        return None
    file = _cache_path(cache, path, nodes, name)
    return json.loads(file.read_text()) if file.exists() else None


def _cache_path(cache: Path, path: Path, nodes: int, name: str) -> Path:
    from scheduler.sim.policies import POLICIES

    digest = hashlib.sha256(path.read_bytes())
    digest.update(f"{nodes}|{name}|{POLICIES[name]!r}".encode())
    for source in sorted((REPO / "scheduler").rglob("*.py")):
        digest.update(source.read_bytes())
    return cache / f"{path.stem}-{name}-{digest.hexdigest()[:16]}.json"


if __name__ == "__main__":
    os.chdir(REPO)
    main()
