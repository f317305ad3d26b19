"""Same simulated results before and after a change, and how long each took.

`run`: simulate one policy on one trace with whichever tree is first on PYTHONPATH and
write a JSON fingerprint: every metric, a digest of every job's outcome (starts, ends,
waits, preemptions, lost work, progress, prediction), the number of passes, a digest of
the per-pass samples, the wall and CPU time and the load average.
`compare`: two folders of fingerprints (old, new): IDENTICAL or DIFF per file.

    cd ../base && PYTHONPATH=$PWD python ../h17/bench/sim_identical.py run \\
        --trace ../shared/traces/itp/cluster08.csv --nodes 11 --policy tiresias --out old/
    python bench/sim_identical.py compare old/ new/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def run(args: argparse.Namespace) -> None:
    from scheduler.sim.engine import Simulator
    from scheduler.sim.jobs import SimConfig
    from scheduler.sim.metrics import compute
    from scheduler.sim.policies import POLICIES
    from scheduler.sim.trace import load_trace

    jobs = load_trace(Path(args.trace), limit=args.limit)
    config = SimConfig(nodes=args.nodes, gpus_per_node=8, nodes_per_rack=4)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = Simulator(jobs, config, POLICIES[args.policy]).run()
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started  # steadier than wall time on a shared machine
    outcomes = hashlib.sha256()
    for j in result.jobs:
        outcome = (j.trace.job_id, j.first_start_s, j.finish_s, j.waited_s, j.preemptions)
        rest = (j.lost_gpu_s, j.runs, j.attained_gpu_s, j.saved_s, j.predicted_s)
        outcomes.update(repr(outcome + rest).encode())
    samples = [(s.time_s, s.busy_gpus, s.queued_jobs) for s in result.samples]
    body = {
        "policy": args.policy,
        "trace": args.trace,
        "nodes": args.nodes,
        "limit": args.limit,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "load": os.getloadavg(),
        "metrics": compute(result).as_dict(),
        "jobs_digest": outcomes.hexdigest(),
        "passes": result.passes,
        "samples_digest": hashlib.sha256(repr(samples).encode()).hexdigest(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{Path(args.trace).stem}-{args.policy}.json"
    (out / name).write_text(json.dumps(body, indent=1, default=str))
    print(f"{name}: {wall_s:.1f} s ({cpu_s:.1f} s CPU), load {body['load']}")


def compare(old: Path, new: Path) -> int:
    differ = 0
    for path in sorted(old.glob("*.json")):
        other = new / path.name
        if not other.exists():
            print(f"{path.name}: missing in {new}")
            differ += 1
            continue
        a: dict[str, Any] = json.loads(path.read_text())
        b: dict[str, Any] = json.loads(other.read_text())
        metrics = [k for k in a["metrics"] if a["metrics"][k] != b["metrics"].get(k)]
        rest = [k for k in ("jobs_digest", "passes", "samples_digest") if a[k] != b[k]]
        same = not metrics and not rest
        differ += not same
        verdict = "IDENTICAL" if same else f"DIFF {metrics + rest}"
        print(f"{path.name}: {verdict}; wall {a['wall_s']:.1f} s -> {b['wall_s']:.1f} s")
    print(f"{len(list(old.glob('*.json')))} compared, {differ} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run")
    one.add_argument("--trace", required=True)
    one.add_argument("--nodes", type=int, required=True)
    one.add_argument("--policy", required=True)
    one.add_argument("--limit", type=int)
    one.add_argument("--out", required=True)
    both = commands.add_parser("compare")
    both.add_argument("old", type=Path)
    both.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        sys.exit(compare(args.old, args.new))


if __name__ == "__main__":
    main()
