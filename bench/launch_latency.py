"""Launch latency of the dp=2 demo job through the whole product.

Starts `gangway serve` with its embedded defaults (SQLite + local Ray, 2 x 4 logical GPUs)
in a temporary data dir, submits the built-in gpt-tiny job with dp=2 several times in a
row and prints, per job: submit -> RUNNING, submit -> first step, submit -> SUCCEEDED,
and the first/last loss.

    .venv/bin/python -m bench.launch_latency --jobs 3 --steps 60
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness.service import Service
from gangway import Builtin, Client, JobState, Parallelism


def measure_one(client: Client, steps: int) -> dict[str, float]:
    started = time.monotonic()
    job = client.submit(
        name="bench-dp2", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=steps)
    )
    marks: dict[str, float] = {}
    while True:
        info = client.get(job.id)
        now = time.monotonic() - started
        if info.state is JobState.RUNNING:
            marks.setdefault("running_s", now)
        if info.progress.step > 0:
            marks.setdefault("first_step_s", now)
        if info.state.is_terminal:
            marks["succeeded_s" if info.state is JobState.SUCCEEDED else "failed_s"] = now
            marks["first_loss"] = info.progress.first_loss or float("nan")
            marks["last_loss"] = info.progress.loss or float("nan")
            marks["tokens_per_s"] = info.progress.tokens_per_s or float("nan")
            return marks
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        service = Service(data_dir=Path(data_dir))
        boot = time.monotonic()
        client = service.start(timeout_s=180)
        print(f"service up (migrations + local Ray + loop) in {time.monotonic() - boot:.1f} s")
        try:
            for index in range(1, args.jobs + 1):
                m = measure_one(client, args.steps)
                print(
                    f"job {index}: RUNNING {m.get('running_s', float('nan')):.1f} s, "
                    f"first step {m.get('first_step_s', float('nan')):.1f} s, "
                    f"SUCCEEDED {m.get('succeeded_s', float('nan')):.1f} s, "
                    f"loss {m['first_loss']:.3f} -> {m['last_loss']:.3f}, "
                    f"{m['tokens_per_s']:.0f} tokens/s"
                )
        finally:
            service.stop()


if __name__ == "__main__":
    main()
