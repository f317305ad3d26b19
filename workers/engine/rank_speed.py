"""How fast this rank is, and what the trainer does with it.

`LocalTimer` times the work a rank does without waiting on a peer (`local_s`): the
runtime's straggler signal, and the speed `BatchShares` splits the global batch by when
`balance_batch` is on (`workers.engine.balance.batch_shares`). Both live beside the training
loop, which owns one of each per rank.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from workers.engine import balance
from workers.engine.checkpoint import is_rank0

# Batch rebalancing: every this many steps, from the medians of the steps since.
REBALANCE_EVERY = 10


class BatchShares:
    """This rank's share of each global batch: equal, or (`balance_batch`) in proportion
    to the ranks' speeds measured over the last `REBALANCE_EVERY` steps."""

    def __init__(
        self, dp: int, global_batch: int, *, enabled: bool, event: Callable[[str], None]
    ) -> None:
        self.dp, self.global_batch, self.enabled, self.event = dp, global_batch, enabled, event
        self.shares = [global_batch // dp] * dp
        self.window: list[float] = []

    def observe(self, step: int, seconds_per_sample: float, group: Any) -> None:
        if not self.enabled or self.dp == 1:
            return
        self.window.append(seconds_per_sample)
        if step % REBALANCE_EVERY:
            return
        mine = torch.tensor([statistics.median(self.window)], dtype=torch.float64)
        self.window = []
        gathered = [torch.zeros_like(mine) for _ in range(self.dp)]
        dist.all_gather(gathered, mine, group=group)
        speeds = [1.0 / max(float(t), 1e-9) for t in gathered]
        shares = balance.batch_shares(speeds, self.global_batch)
        if shares != self.shares and is_rank0():
            rates = ", ".join(f"{s:.1f}" for s in speeds)
            line = (
                f"step {step}: batch shares {self.shares} -> {shares} "
                f"(rank speeds, samples/s: {rates})"
            )
            print(line, flush=True)
            self.event(line)
        self.shares = shares


class LocalTimer:
    """Time in work that waits on no peer (`local_s`, the runtime's straggler signal).

    A peer's wait hides in every synchronised step time: each rank's step takes as long as
    the slowest's. A forward pass of plain data parallel involves no collective, so its
    time is this rank's own speed. CUDA events on the compute stream (read once the step
    has synchronised), wall time on CPU. Not measured under a pipeline schedule, whose
    forwards interleave with sends and receives; under TP or FSDP the forward holds their
    collectives, so a slow rank slows its group's forwards alike.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[Any] = []

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        if self.cuda:
            start, end = _timing_event(), _timing_event()
            start.record()
            yield
            end.record()
            self.spans.append((start, end))
        else:
            began = time.perf_counter()
            yield
            self.spans.append(time.perf_counter() - began)

    def total_s(self) -> float | None:
        """The step's total, then start over; None when nothing was timed."""
        spans, self.spans = self.spans, []
        if not spans:
            return None
        if self.cuda:
            return float(sum(start.elapsed_time(end) for start, end in spans)) / 1000.0
        return float(sum(spans))


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
