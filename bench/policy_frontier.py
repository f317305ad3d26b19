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
trace's bytes, the cluster, the baseline's config and the scheduler's source (core and
simulator), so a change to the policy reruns only the policy; a change to the core reruns
everything. Each baseline is cached as it ends. Simulations run `--procs` at a time
(default 2). `--fair-share on|off` overrides the policy's fair share (a simulator
policy's setting, not a `PolicyConfig` knob).

`--seed N` (repeatable) runs every policy on a perturbed copy of each trace: every
submit time moved later by a draw from [0, `--jitter-s`) seconds (default 300), the
same draws for all three policies. Seed 0 is the trace as given. A single run's ratios
move with such small perturbations (the schedules are chaotic: one early start reorders
everything after it), so a ratio within that spread of 1.0 is not a result; the summary
gives, per trace, on how many seeds all four goals were met.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import math
import random
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from scheduler.core import PolicyConfig
from scheduler.sim.engine import Simulator
from scheduler.sim.jobs import SimConfig
from scheduler.sim.metrics import compute
from scheduler.sim.policies import POLICIES, SimPolicy
from scheduler.sim.trace import TraceJob, load_trace

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
BASELINES = ("tiresias", "fifo")
Run = tuple[Path, int, SimPolicy, int, float]  # trace, nodes, policy, seed, jitter
Figures = dict[str, Any]


def main() -> None:
    args = _parser().parse_args()
    traces = _traces(args)
    policy = _policy(args)
    seeds = list(dict.fromkeys(args.seed or [0]))
    store = Path(args.cache).expanduser()
    store.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trials = [(path, nodes, seed) for seed in seeds for path, nodes in traces]
    wanted = [
        (path, nodes, POLICIES[name], seed, args.jitter_s)
        for path, nodes, seed in trials
        for name in BASELINES
    ]
    missing = [run for run in wanted if not _cache_path(store, run).exists()]
    runs = missing + [(path, nodes, policy, seed, args.jitter_s) for path, nodes, seed in trials]
    with ProcessPoolExecutor(args.procs) as pool:
        results = _each_cached(store, runs, pool.map(_simulate, runs), len(missing))
        measured = list(results)[len(missing) :]
    knobs = " ".join([*args.set, *([f"fair-share={args.fair_share}"] if args.fair_share else [])])
    print(f"{args.policy} {knobs} against tiresias (2D-LAS) and fifo")
    met: dict[tuple[Path, int], int] = {}
    for seed in seeds:
        print(f"seed {seed}" + (f" (submit times + [0, {args.jitter_s:g}) s)" if seed else ""))
        print(
            f"{'trace':<16} {'JCT':>6} {'p99':>6} {'longest':>8} {'lost':>6}"
            f" {'preemptions':>13} {'long/2FIFO':>10}  missed"
        )
        count = 0
        for (path, nodes, trial_seed), mine in zip(trials, measured, strict=True):
            if trial_seed != seed:
                continue
            baselines = (
                _cached(store, (path, nodes, POLICIES[name], seed, args.jitter_s))
                for name in BASELINES
            )
            good = _report(path, mine, *baselines)
            met[(path, nodes)] = met.get((path, nodes), 0) + good
            count += good
        print(f"all four goals met on {count} of {len(traces)} traces")
    if len(seeds) > 1:
        print(f"seeds on which all four goals were met, of {len(seeds)}:")
        print("  " + ", ".join(f"{path.stem} {met[(path, nodes)]}" for path, nodes in traces))
    print(f"({time.perf_counter() - started:.0f} s)")


def _each_cached(
    store: Path, runs: list[Run], results: Iterator[Figures], baselines: int
) -> Iterator[Figures]:
    """Each result as it ends, the first `baselines` of them written to the cache first
    (a failure later in the run keeps them)."""
    for index, (run, figures) in enumerate(zip(runs, results, strict=True)):
        if index < baselines:
            _cache_path(store, run).write_text(json.dumps(figures))
        yield figures


def _report(path: Path, mine: Figures, las: Figures, fifo: Figures) -> bool:
    """Print one trace's line; True when all four goals are met."""
    ratios = [_ratio(mine[key], las[key]) for key in GOALS]
    missed = [key for key, ratio in zip(GOALS, ratios, strict=True) if ratio > 1.0]
    stretch = _ratio(mine["longest_wait_s"], 2 * fifo["longest_wait_s"])
    jct, p99, longest, lost = ratios
    print(
        f"{path.stem:<16} {jct:6.3f} {p99:6.3f} {longest:8.3f} {lost:6.3f}"
        f" {mine['preemptions']:>6}/{las['preemptions']:<6} {stretch:10.2f}  "
        + (", ".join(missed) or "none")
    )
    return not missed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="gangway", choices=sorted(POLICIES))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="override a PolicyConfig knob of the policy (repeatable)",
    )
    parser.add_argument(
        "--fair-share", choices=("on", "off"), help="override the policy's fair share"
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
    parser.add_argument(
        "--seed",
        action="append",
        type=_seed,
        default=[],
        metavar="N",
        help="perturb submit times with this seed, 0: as given (repeatable; default 0)",
    )
    parser.add_argument(
        "--jitter-s",
        type=_nonnegative,
        default=300.0,
        metavar="S",
        help="largest delay added to a submit time under a seed (default 300)",
    )
    parser.add_argument("--shared", default=str(SHARED_TRACES), help="the shared traces' folder")
    parser.add_argument(
        "--cache", default="~/.cache/gangway-frontier", help="where baselines are kept"
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=2,
        choices=range(1, 65),
        metavar="N",
        help="simulations at a time (1-64)",
    )
    return parser


def _policy(args: argparse.Namespace) -> SimPolicy:
    """The policy to measure, its knobs overridden; bad knobs end the run before any
    simulation does."""
    policy = POLICIES[args.policy]
    overrides = dict(_override(text) for text in args.set)
    try:
        config = dataclasses.replace(policy.config, **overrides)
    except ValueError as exc:
        raise SystemExit(f"--set: {exc}") from None
    fair_share = policy.fair_share if args.fair_share is None else args.fair_share == "on"
    return dataclasses.replace(policy, config=config, fair_share=fair_share)


def _traces(args: argparse.Namespace) -> list[tuple[Path, int]]:
    """The shared traces (all, or those named by --only; none when only --trace is
    given), then the --trace ones; each must exist."""
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
        if not path or not nodes.isdigit() or int(nodes) < 1:
            raise SystemExit(f"--trace {text!r}: expected PATH:NODES")
        chosen.append((Path(path), int(nodes)))
    absent = [str(path) for path, _ in chosen if not path.is_file()]
    if absent:
        raise SystemExit(f"no such trace: {', '.join(absent)}")
    return chosen


def _override(text: str) -> tuple[str, Any]:
    """`knob=value`, parsed as the type of the knob's default (tuples: comma-separated);
    a value of the wrong type ends the run, naming the knob."""
    name, sep, value = text.partition("=")
    defaults = {f.name: f.default for f in dataclasses.fields(PolicyConfig)}
    if not sep or name not in defaults:
        raise SystemExit(f"--set {text!r}: expected KNOB=VALUE with a PolicyConfig knob")
    default = defaults[name]
    try:
        if isinstance(default, bool):
            return name, _boolean(value)
        if isinstance(default, tuple):
            return name, tuple(float(v) for v in value.split(",") if v)
        if isinstance(default, int | float | str):
            return name, type(default)(value)
    except ValueError:
        kind = "true or false" if isinstance(default, bool) else type(default).__name__
        raise SystemExit(f"--set {text!r}: {name} takes {kind}") from None
    raise SystemExit(f"--set {text!r}: {name} cannot be set from the command line")


def _boolean(value: str) -> bool:
    words = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}
    if value.lower() not in words:
        raise ValueError(value)
    return words[value.lower()]


def _nonnegative(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text}: must be finite and >= 0")
    return value


def _seed(text: str) -> int:
    """A seed >= 0 (random.Random(-n) draws as Random(n): one trial counted twice)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def _simulate(run: Run) -> Figures:
    """One simulation (in a worker process): the figures the goals compare."""
    path, nodes, policy, seed, jitter_s = run
    trace = _perturbed(load_trace(path), seed, jitter_s)
    metrics = compute(Simulator(trace, _cluster(nodes), policy).run())
    return {key: getattr(metrics, key) for key in KEPT}


def _perturbed(jobs: list[TraceJob], seed: int, jitter_s: float) -> list[TraceJob]:
    """Seed 0: the trace as given. Otherwise each submit time later by a draw from
    [0, jitter_s), in the trace's order, re-sorted as `load_trace` sorts."""
    if not seed:
        return jobs
    draw = random.Random(seed).uniform
    moved = [dataclasses.replace(job, submit_s=job.submit_s + draw(0, jitter_s)) for job in jobs]
    return sorted(moved, key=lambda job: (job.submit_s, job.job_id))


def _cluster(nodes: int) -> SimConfig:
    """The table's cluster: nodes of 8 GPUs, 4 to a rack, the simulator's defaults."""
    return SimConfig(nodes=nodes, gpus_per_node=8, nodes_per_rack=4)


def _ratio(mine: float, theirs: float) -> float:
    """mine / theirs; where theirs is 0: 0 when mine is too (met), else infinite."""
    if theirs:
        return mine / theirs
    return 0.0 if not mine else float("inf")


def _cached(store: Path, run: Run) -> Figures:
    return dict(json.loads(_cache_path(store, run).read_text()))


def _cache_path(store: Path, run: Run) -> Path:
    """Where a baseline's figures are kept: named by everything they depend on."""
    path, nodes, policy, seed, jitter_s = run
    perturbation = f"|{seed}|{jitter_s!r}|{_perturbation_digest()}" if seed else ""
    digest = hashlib.sha256(_file_digest(path).encode())
    digest.update(f"{_cluster(nodes)!r}|{KEPT}|{policy!r}|{_source_digest()}".encode())
    digest.update(perturbation.encode())
    return store / f"{path.stem}-{policy.name}-{digest.hexdigest()[:16]}.json"


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@cache
def _perturbation_digest() -> str:
    """How seeds perturb a trace: a change to it must not reuse perturbed baselines."""
    return hashlib.sha256(inspect.getsource(_perturbed).encode()).hexdigest()


@cache
def _source_digest() -> str:
    """The scheduler's source (core, predictor, simulator): what the figures depend on."""
    digest = hashlib.sha256()
    for source in sorted((REPO / "scheduler").rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()


if __name__ == "__main__":
    main()
