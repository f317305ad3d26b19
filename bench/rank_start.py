"""How long a gang's rank actors take to start, with and without the trainer's imports.

A rank of the built-in trainer imports torch._dynamo and the engine in its constructor
(`RankActor(preload_trainer=True)`); a script, command or function rank does not. This
starts `--ranks` actors on a local Ray (logical GPUs) at once, the two kinds alternated
`--rounds` times, and prints the time until every actor answered its first call.

    .venv/bin/python -m bench.rank_start --ranks 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from workers.supervisor.actor import RankActor


def start_gang(ranks: int, *, preload_trainer: bool) -> float:
    """Seconds from asking for `ranks` actors to all of them answering."""
    remote_cls = ray.remote(RankActor)
    began = time.monotonic()
    actors = [
        remote_cls.options(num_gpus=1, num_cpus=0).remote(preload_trainer=preload_trainer)
        for _ in range(ranks)
    ]
    ray.get([actor.status.remote() for actor in actors])
    elapsed = time.monotonic() - began
    for actor in actors:
        ray.kill(actor)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_gpus=args.ranks, include_dashboard=False)
    try:
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for preload in (True, False):
                times[preload].append(start_gang(args.ranks, preload_trainer=preload))
                time.sleep(1.0)  # let the killed workers exit before the next gang
        for preload, label in ((True, "built-in (preload)"), (False, "other (no preload)")):
            runs = ", ".join(f"{t:.1f}" for t in times[preload])
            print(f"{label}: median {statistics.median(times[preload]):.1f} s ({runs})")
        ratio = statistics.median(times[True]) / statistics.median(times[False])
        print(f"{args.ranks} ranks: preload / no preload = {ratio:.2f}x")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
