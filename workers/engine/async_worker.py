"""What every rank runs in asynchronous data parallel, and the wire it talks over.

`workers.engine.async_ps` holds the server and drives the run; this module is the other side of
it. A rank pulls the master parameters (their version, the count of updates applied, and
a slice of samples), computes a gradient on its own batch on a working copy (`Worker`)
and pushes it, until the server says the segment is done.

Wire: a dedicated gloo group, point-to-point; a push or a reply is one float32 tensor,
the flat gradient or parameters then a `HEADER`, each rank's two buffers allocated once.
Rank 0's own worker calls the server directly under the same lock and flattens nothing:
the master takes its gradients as they are and its parameters are copied straight into
the worker's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import clip_grad_norm_

from workers.engine.data import TokenStream

# 4 float32 slots end each message, the first 3 holding int32 bits (exact however large).
# Push: version, stop asked, kind (0: a pull only), the loss as a float. Reply: version,
# done (0, DONE_TARGET or DONE_STOP), first sample, unused.
HEADER, DONE_TARGET, DONE_STOP = 4, 1, 2

# Rank 0's own push: its gradients, the version they were computed at, the loss.
Pushed = tuple[list[torch.Tensor], int, float]


def header(message: torch.Tensor) -> torch.Tensor:
    """The header's int32 view (writes go through to the message)."""
    return message[-HEADER:].view(torch.int32)


@dataclass
class Worker:
    """What a rank needs to compute one update on its own."""

    model: nn.Module  # the working copy: the master's parameters at some version
    stream: TokenStream
    batch_size: int
    accumulation: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    max_grad_norm: float | None
    slowdown: float
    device: torch.device

    @property
    def samples(self) -> int:
        return self.batch_size * self.accumulation

    def gradient(self, first_sample: int) -> float:
        """Compute this rank's gradient (left in the model's `.grad`) and loss on samples
        from `first_sample`."""
        self.model.zero_grad(set_to_none=True)
        loss = compute_s = 0.0
        for micro in range(self.accumulation):
            inputs, targets = self.stream.samples(
                first_sample + micro * self.batch_size, self.batch_size
            )
            began = time.perf_counter()
            output = self.model(inputs.to(self.device))
            compute_s += time.perf_counter() - began
            value = self.loss_fn(output, targets.to(self.device))
            began = time.perf_counter()
            value.backward()  # type: ignore[no-untyped-call]
            compute_s += time.perf_counter() - began
            loss += float(value.detach())
        if self.max_grad_norm is not None:
            clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        # An injected straggler: forward and backward take slowdown x as long. Slept after
        # them, unlike the sync loop: here no collective runs during backward to overlap.
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * compute_s)
        return loss

    def grads(self) -> list[torch.Tensor]:
        return [
            p.grad if p.grad is not None else torch.zeros_like(p) for p in self.model.parameters()
        ]


def local_loop(
    worker: Worker,
    exchange: Callable[[list[torch.Tensor], Pushed | None, bool], tuple[int, int, int]],
    should_stop: Callable[[], bool],
    on_update: Callable[[], None],
) -> bool:
    """Rank 0's worker: `exchange` is the server's `exchange_local`."""
    params: list[torch.Tensor] = list(worker.model.parameters())
    pushed: Pushed | None = None  # None: a pull only
    while True:
        version, done, first_sample = exchange(params, pushed, should_stop())
        if done:
            return done == DONE_STOP
        loss = worker.gradient(first_sample)
        pushed = worker.grads(), version, loss
        on_update()


def remote_loop(
    worker: Worker,
    group: dist.ProcessGroup,
    size: int,
    should_stop: Callable[[], bool],
    on_update: Callable[[], None],
) -> bool:
    """The other ranks' worker: pushes and pulls over `group` (see the module doc)."""
    params: list[torch.Tensor] = list(worker.model.parameters())
    push, reply = torch.zeros(size), torch.empty(size)  # push: kind 0, a pull
    received = views(reply[:-HEADER], params)
    while True:
        header(push)[1] = int(should_stop())
        dist.send(push, dst=0, group=group)
        dist.recv(reply, src=0, group=group)
        version, done, first_sample = (int(x) for x in header(reply)[:3])
        if done:
            return done == DONE_STOP
        with torch.no_grad():
            torch._foreach_copy_(params, received)
        push[-1] = worker.gradient(first_sample)
        flatten_into(worker.grads(), push[:-HEADER])
        header(push)[:3] = torch.tensor([version, 0, 1])
        on_update()


def views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` cut into tensors shaped as `like` (views: no copy)."""
    parts, offset = [], 0
    for tensor in like:
        parts.append(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
    return parts


def flatten_into(tensors: Sequence[torch.Tensor], out: torch.Tensor) -> None:
    """Concatenate `tensors`, flattened, into `out` (one copy on the same device)."""
    flat = [t.detach().reshape(-1) for t in tensors]
    if all(t.device == out.device for t in flat):
        torch.cat(flat, out=out)
    else:
        out.copy_(torch.cat(flat))
