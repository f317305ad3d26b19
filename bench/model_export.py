"""What an export gives: file sizes and validation losses, full precision and int8.

Trains `--model` for `--steps` in one process (the built-in trainer, a checkpoint at the
end), exports that checkpoint as the export job does (`workers.program.export`), and
prints each file's bytes and validation loss on the held-out split, the size ratio and
the loss the int8 copy gives up.

    .venv/bin/python -m bench.model_export --model gpt-mini --steps 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec, train
from workers.launch import RankInfo
from workers.program.context import RankContext
from workers.program.export import FULL, INT8, export_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    info = RankInfo(rank=0, world_size=1, local_rank=0, dp=1, tp=1, pp=1)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        checkpoints, outputs = root / "checkpoints", root / "outputs"
        outputs.mkdir()
        ctx = RankContext(info, threading.Event(), checkpoint_dir=checkpoints)
        spec = TrainSpec(model=args.model, steps=args.steps, batch_size=args.batch_size)
        with _one_process_group():
            result = train(ctx, ParallelPlan(), spec, checkpoint_dir=checkpoints)
        exporter = RankContext(
            info,
            threading.Event(),
            outputs_dir=outputs,
            model_dir=checkpoints / f"step-{result.step:08d}",
        )
        summary = export_model(
            exporter, model=args.model, eval_batch=args.batch_size, quantize="int8"
        )
    print(json.dumps(summary))
    print(_line(args.model, args.steps, summary["files"]))


@contextlib.contextmanager
def _one_process_group() -> Iterator[None]:
    """The trainer runs on a process group: one of one process here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _line(model: str, steps: int, files: dict[str, Any]) -> str:
    full, int8 = files[FULL], files[INT8]
    return (
        f"{model} after {steps} steps: {FULL} {full['bytes']:,} bytes val_loss "
        f"{full['val_loss']:.4f}; {INT8} {int8['bytes']:,} bytes val_loss {int8['val_loss']:.4f}; "
        f"{full['bytes'] / int8['bytes']:.2f}x smaller, val_loss "
        f"{(int8['val_loss'] / full['val_loss'] - 1) * 100:+.2f}%"
    )


if __name__ == "__main__":
    main()
