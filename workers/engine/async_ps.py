"""Asynchronous data parallel with bounded staleness, parameter-server style.

Global rank 0 holds the master parameters and optimizer (the trainer's own: checkpoints
and resume are the usual ones). Every rank pulls the master parameters (their version,
the count of updates applied, and a slice of samples), computes a gradient on its own
batch on a working copy and pushes it; the server applies a gradient of version v while
the master is at <= v + S (`max_staleness`), else drops it and the rank tries again. No
rank waits for another: the gang's tokens/s is the sum of the ranks' rates.

This module is the server and the run; what each rank computes and the wire between them
are `workers.engine.async_worker`. A thread on rank 0 answers the other ranks; rank 0's own
worker calls the server directly under the same lock. The server steps the optimizer for
every rank's update, one after another on rank 0, so that step's cost is paid dp times
per round (the trainer gives the async master torch's fused AdamW). The run goes in
segments ending at a checkpoint step, at `spec.steps` or on a stop: every rank leaves the
loop, rank 0 broadcasts the master model and optimizer state (DCP saves replicated
tensors from any rank), and the usual checkpoint is taken.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.engine.async_worker import (
    DONE_STOP,
    DONE_TARGET,
    HEADER,
    Pushed,
    Worker,
    flatten_into,
    header,
    local_loop,
    remote_loop,
    views,
)
from workers.engine.updates import CommMeter

SWITCH_INTERVAL_S = 0.0005  # rank 0 while it serves (see run_segment)


class Server:
    """The master parameters and the staleness rule, shared by rank 0's two threads."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        version: int,
        next_sample: int,
        samples: int,  # per update
        max_staleness: int,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.params: list[torch.Tensor] = list(model.parameters())
        self.version, self.next_sample, self.samples = version, next_sample, samples
        self.max_staleness = max_staleness
        self.target = version
        self.stopping = False
        self.lock = threading.Lock()
        # Since the last `take()`: applied updates, their losses, dropped updates.
        self.applied: list[float] = []
        self.dropped = 0
        self.staleness_seen = 0  # the largest staleness of any applied update, ever
        # The wire: each remote exchange's bytes (in and out) and time sending the reply.
        self.meter = CommMeter()

    def exchange(self, push: torch.Tensor, reply: torch.Tensor) -> None:
        """A remote rank's push: apply its gradient if fresh enough; write the reply (see
        the module doc). The gradient is read in place from `push`."""
        version, stop, kind = (int(x) for x in header(push)[:3])
        grads = views(push[:-HEADER].to(self.params[0].device), self.params) if kind else None
        with self.lock:
            answer = self._serve(grads, version, bool(stop), float(push[-1]))
            if not answer[1]:
                flatten_into(self.params, reply[:-HEADER])
        header(reply)[:3] = torch.tensor(answer)

    def exchange_local(
        self, params: list[torch.Tensor], pushed: Pushed | None, stop: bool
    ) -> tuple[int, int, int]:
        """Rank 0's own worker: apply its gradients if fresh enough, then copy the
        master's parameters into its `params`; the reply's header (version, done, first
        sample)."""
        grads, version, loss = pushed if pushed is not None else (None, 0, 0.0)
        with self.lock:
            answer = self._serve(grads, version, stop, loss)
            if not answer[1]:
                with torch.no_grad():
                    torch._foreach_copy_(params, self.params)
        return answer

    def _serve(
        self, grads: list[torch.Tensor] | None, version: int, stop: bool, loss: float
    ) -> tuple[int, int, int]:
        """Under the lock: version, done (0, DONE_TARGET or DONE_STOP), first sample."""
        if grads is not None:
            self._apply(grads, version, loss)
        self.stopping = self.stopping or stop
        if self.stopping or self.version >= self.target:
            return self.version, DONE_STOP if self.stopping else DONE_TARGET, 0
        first_sample = self.next_sample
        self.next_sample += self.samples
        return self.version, 0, first_sample

    def _apply(self, grads: list[torch.Tensor], version: int, loss: float) -> None:
        staleness = self.version - version
        if staleness > self.max_staleness or self.version >= self.target:
            self.dropped += 1
            return
        for param, g in zip(self.params, grads, strict=True):
            param.grad = g
        self.optimizer.step()
        for param in self.params:  # the gradients belong to a buffer or to a worker
            param.grad = None
        self.scheduler.step()
        self.version += 1
        self.staleness_seen = max(self.staleness_seen, staleness)
        self.applied.append(loss)

    def take(self) -> tuple[list[float], int]:
        with self.lock:
            taken = (self.applied, self.dropped)
            self.applied, self.dropped = [], 0
            return taken


def serve(server: Server, group: dist.ProcessGroup, size: int, remotes: int) -> None:
    """Answer the other ranks until each has been told the segment is done."""
    push, reply = torch.empty(size), torch.zeros(size)
    while remotes:
        source = dist.recv(push, group=group)  # from any rank
        server.exchange(push, reply)
        with server.meter.timed(2 * size * push.element_size()):  # a push in, a reply out
            dist.send(reply, dst=source, group=group)
        if header(reply)[1]:
            remotes -= 1


def run_segment(
    worker: Worker,
    group: dist.ProcessGroup,
    *,
    server: Server | None,
    should_stop: Callable[[], bool],
    on_update: Callable[[], None],
) -> bool:
    """Pull, compute, push until the server says the segment is done; True if it ended
    on a stop request. Rank 0 passes its `server` and runs the answering thread."""
    size = sum(p.numel() for p in worker.model.parameters()) + HEADER
    thread = None
    switch_interval = sys.getswitchinterval()
    if server is not None and dist.get_world_size() > 1:
        remotes = dist.get_world_size() - 1
        thread = threading.Thread(target=serve, args=(server, group, size, remotes), daemon=True)
        thread.start()
        # A push that arrives while rank 0's worker holds the GIL (a forward's ops do)
        # waits for it up to the switch interval (5 ms by default) before the answering
        # thread runs, and the remote rank idles meanwhile.
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
    try:
        if server is not None:
            return local_loop(worker, server.exchange_local, should_stop, on_update)
        return remote_loop(worker, group, size, should_stop, on_update)
    finally:
        if thread is not None:
            thread.join()
            sys.setswitchinterval(switch_interval)


def share_master(
    model: nn.Module, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup
) -> None:
    """Give every rank rank 0's master model and optimizer state (before a checkpoint)."""
    state = [_to_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()})]
    dist.broadcast_object_list(state, src=0, group=group)
    if dist.get_rank() != 0:
        model.load_state_dict(state[0]["model"])
        optimizer.load_state_dict(state[0]["optimizer"])


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


@dataclass
class Outcome:
    step: int
    losses: list[float]  # of every applied update (rank 0)
    stopped: bool


def train_async(
    worker: Worker,
    server: Server,
    *,
    steps: int,
    checkpoint_interval: int | None,
    reporter: Any,
    save: Callable[[int, int], dict[str, float]],
) -> Outcome:
    """Run segments up to `steps` applied updates. `server` exists on every rank (its
    model and optimizer are the checkpointed ones) but only rank 0's serves. `save(step,
    next_sample)` checkpoints on every rank; the metrics it returns join the reports."""
    group = dist.new_group(backend="gloo")
    rank0 = dist.get_rank() == 0
    tokens_per_update = worker.samples * _seq_len(worker)
    losses: list[float] = []
    saved: dict[str, float] = {}
    last = time.perf_counter()

    def report() -> None:
        """Rank 0: the updates applied since the last report."""
        nonlocal last
        applied, dropped = server.take()
        if not applied:
            return
        now = time.perf_counter()
        elapsed, last = now - last, now
        losses.extend(applied)
        comm_s, comm_bytes = server.meter.take()
        reporter.report(
            step=server.version,
            loss=sum(applied) / len(applied),
            tokens_per_s=len(applied) * tokens_per_update / elapsed,
            step_time_s=elapsed / len(applied),
            updates_dropped=float(dropped),
            max_staleness=float(server.staleness_seen),
            comm_s=comm_s / len(applied),
            comm_bytes=comm_bytes / len(applied),
            **saved,
        )

    stopped = False
    while server.version < steps and not stopped:
        end = steps
        if checkpoint_interval:
            end = min(steps, (server.version // checkpoint_interval + 1) * checkpoint_interval)
        server.target = end
        stopped = run_segment(
            worker,
            group,
            server=server if rank0 else None,
            should_stop=reporter.should_stop,
            on_update=report if rank0 else lambda: None,
        )
        if rank0:
            report()
        counters = torch.tensor([server.version, server.next_sample, int(stopped)])
        dist.broadcast(counters, src=0, group=group)
        server.version, server.next_sample = int(counters[0]), int(counters[1])
        stopped = bool(counters[2])
        share_master(server.model, server.optimizer, group)
        saved = save(server.version, server.next_sample)
        if saved and rank0:  # the runtime learns how far a resume would start
            reporter.report(step=server.version, **saved)
    return Outcome(server.version, losses, stopped)


def _seq_len(worker: Worker) -> int:
    inputs, _ = worker.stream.samples(0, 1)
    return int(inputs.shape[-1])
