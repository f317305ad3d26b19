"""Small function entrypoints: runnable examples of `fn(ctx, **kwargs)` and test fixtures.

Submit one with `{"kind": "function", "target": "workers.examples:allreduce_ranks"}`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from workers import faults
from workers.program.context import RankContext


def allreduce_ranks(ctx: RankContext, steps: int = 3) -> None:
    """All-reduce each rank's id `steps` times and check the sum: the gang is wired."""
    expected = ctx.world_size * (ctx.world_size - 1) // 2
    for step in range(1, steps + 1):
        value = torch.tensor([float(ctx.rank)])
        dist.all_reduce(value)
        if int(value.item()) != expected:
            raise RuntimeError(f"all_reduce gave {value.item()}, expected {expected}")
        ctx.report(step=step)


def write_output(ctx: RankContext, name: str = "result.txt", text: str = "done") -> None:
    """Rank 0 writes one file to the job's outputs: what a later job reads (`inputs_from`)."""
    if ctx.rank == 0 and ctx.outputs_dir is not None:
        (ctx.outputs_dir / name).write_text(text)


def print_inputs(ctx: RankContext) -> None:
    """Print each file of the other jobs' outputs this job reads (INPUTS_DIR, relative
    path and text), then whether it may write there."""
    root = Path(os.environ["INPUTS_DIR"])
    files = sorted(path for path in root.rglob("*") if path.is_file())
    for path in files:
        print(f"{path.relative_to(root)}: {path.read_text().strip()}", flush=True)
    try:
        (files[0].parent / "planted").write_text("x")
        print("writable", flush=True)
    except (OSError, IndexError):
        print("read-only", flush=True)


def sleep_steps(ctx: RankContext, steps: int = 100, step_s: float = 0.1) -> None:
    """A long-running job that reports steps and stops early when asked."""
    for step in range(1, steps + 1):
        if ctx.should_stop():
            return
        time.sleep(step_s)
        ctx.report(step=step)


def fail_on_rank(ctx: RankContext, rank: int = 0, message: str = "boom") -> None:
    """Raise on one rank after a barrier: how a user's exception surfaces."""
    dist.barrier()
    if ctx.rank == rank:
        raise RuntimeError(message)
    dist.barrier()


def check_mesh(ctx: RankContext) -> None:
    """Build the (pp, dp, tp) DeviceMesh and all-reduce over its data-parallel axis."""
    mesh = ctx.mesh
    info = ctx.info
    if tuple(mesh.mesh.shape) != (info.pp, info.dp, info.tp):
        raise RuntimeError(f"mesh shape {tuple(mesh.mesh.shape)} != {(info.pp, info.dp, info.tp)}")
    value = torch.ones(1)
    dist.all_reduce(value, group=mesh.get_group("dp"))
    if int(value.item()) != info.dp:
        raise RuntimeError(f"dp all_reduce gave {value.item()}, expected {info.dp}")
    ctx.report(step=1)


def hang_at_step(ctx: RankContext, step: int = 3, step_s: float = 0.05) -> None:
    """Report steps 1..`step`, then hang like a deadlocked collective: never return, never
    look at `should_stop()`. For hang detection."""
    for current in range(1, step + 1):
        time.sleep(step_s)
        ctx.report(step=current)
        print(f"rank {ctx.rank} reached step {current}", flush=True)
    while True:
        time.sleep(1.0)


def checkpointed_steps(
    ctx: RankContext, steps: int = 100, step_s: float = 0.1, every: int = 5
) -> None:
    """Count steps like a trainer that checkpoints: rank 0 saves the count every `every`
    steps and at a stop notice (written, then renamed: a crash mid-save leaves the
    previous count) and a new attempt resumes from it. Rank 0 appends every resume and
    step to `ledger` in the checkpoint directory, so a test can count the steps each
    failure made the job do again. Fault points: `checkpoint.save` (before the rename)."""
    directory = ctx.checkpoint_dir
    if directory is None:
        raise ValueError("checkpointed_steps needs a checkpoint directory")
    directory.mkdir(parents=True, exist_ok=True)
    count = directory / "count"
    saved = int(count.read_text()) if count.exists() else 0
    lead = ctx.rank == 0
    if lead:
        _append(directory / "ledger", f"resume {saved}")

    def save(step: int) -> int:
        if lead:
            partial = directory / "count.partial"
            partial.write_text(str(step))
            faults.inject("checkpoint.save")
            partial.replace(count)
        return step

    for step in range(saved + 1, steps + 1):
        if ctx.should_stop():
            saved = save(step - 1)
            ctx.report(step=step - 1, checkpoint_step=saved)
            return
        time.sleep(step_s)
        if lead:
            _append(directory / "ledger", f"step {step}")
        if step % every == 0:
            saved = save(step)
        ctx.report(step=step, checkpoint_step=saved)


def _append(path: Path, line: str) -> None:
    with path.open("a") as ledger:
        ledger.write(line + "\n")
