"""The rank actor: one per rank of a gang, running the job's entrypoint in a thread.

`start()` returns at once and the entrypoint runs in a thread, so the runtime polls
`status()` instead of holding an ObjectRef to a long call. That is what lets a restarted
service reattach to ranks that kept running: the status lives in the (detached) actor, not
in the service's memory.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import workers.faults  # noqa: F401  (reads a test's injected faults before `start` scrubs them)
from gangway.models import CheckpointPolicy, wire_default
from workers.program.context import Progress, RankContext, RankInfo
from workers.program.script import torchrun_env
from workers.supervisor.environment import scrub_process
from workers.supervisor.logtap import LineBuffer, Tap

# Phases a rank reports; the group aggregates them.
IDLE, RUNNING, SUCCEEDED, FAILED = "idle", "running", "succeeded", "failed"


class RankActor:
    def __init__(self, *, preload_trainer: bool) -> None:
        # A rank of the built-in trainer (`preload_trainer`) imports its heavy parts now,
        # while the gang is still assembling: the first DDP(...) imports torch._dynamo
        # lazily (~4 s), which would otherwise stall step 1. Other ranks import what their
        # code uses when it uses it (a script or command trains in a child process): here
        # the imports would cost every rank ~5 s of CPU before its gang could start.
        if preload_trainer:
            import torch._dynamo
            import torch.distributed  # noqa: F401

            import workers.engine.training  # noqa: F401  (FSDP, TP, pipelining, DCP: ~1 s more)

        self._logs = LineBuffer()
        sys.stdout = Tap(sys.stdout, self._logs, "stdout")
        sys.stderr = Tap(sys.stderr, self._logs, "stderr")
        self._stop_event = threading.Event()
        self._phase = IDLE
        self._error: str | None = None
        self._failed_at: float | None = None
        self._ctx: RankContext | None = None
        self._thread: threading.Thread | None = None
        # When the stop notice came and when the entrypoint returned: the acknowledgement
        # time of a preemption or resize (the trainer saves before it returns).
        self._stop_at: float | None = None
        self._ended_at: float | None = None
        self._store: Any = None  # rank 0 of a script gang: the process-group store

    def rendezvous_address(self, store_world_size: int | None = None) -> tuple[str, int]:
        """This node's address and a free port: rank 0 hosts the process-group store. A
        script gang's store (`store_world_size`: its ranks) is this actor's, bound here
        on a port the system picks, so no other process can take it in between."""
        import ray

        address = ray.util.get_node_ip_address()
        if store_world_size is not None:
            self._store = host_store(address, store_world_size)
            return address, int(self._store.port)
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return address, int(port)

    def start(
        self,
        *,
        info: RankInfo,
        master_addr: str,
        master_port: int,
        entrypoint: dict[str, Any],
        timeout_s: float = 600.0,
    ) -> str:
        """Start the entrypoint in a thread; returns this rank's Ray node id."""
        import ray

        if self._thread is not None:
            raise RuntimeError("this rank was already started")
        directory = entrypoint.get("checkpoint_dir")
        self._ctx = RankContext(
            info,
            self._stop_event,
            checkpoint_dir=Path(directory) if directory else None,
            keep_last=int(entrypoint.get("keep_last", wire_default(CheckpointPolicy, "keep_last"))),
        )
        # Function ranks run in this process: it keeps no secret of whoever started the
        # raylet, and entrypoints written for torchrun find the variables it sets.
        scrub_process(entrypoint.get("env") or {})
        os.environ.update(torchrun_env(self._ctx, master_addr, master_port))
        self._phase = RUNNING
        target: Callable[..., None]
        args: tuple[Any, ...]
        if entrypoint["kind"] in ("script", "command"):  # they make their own process group
            target, args = self._run_script, (self._ctx, entrypoint, master_addr, master_port)
        else:
            init_method = f"tcp://{master_addr}:{master_port}"
            target, args = self._run, (self._ctx, init_method, entrypoint, timeout_s)
        self._thread = threading.Thread(
            target=target, args=args, name=f"rank-{info.rank}", daemon=True
        )
        self._thread.start()
        return str(ray.get_runtime_context().get_node_id())

    def status(self, log_after: int = 0) -> dict[str, Any]:
        """Phase, progress, and the output lines numbered above `log_after`."""
        progress = self._ctx.progress() if self._ctx else Progress()  # not started: nothing
        return {
            "logs": self._logs.since(log_after),
            "phase": self._phase,
            "error": self._error,
            "failed_at": self._failed_at,
            "step": progress.step,
            "loss": progress.loss,
            "first_loss": progress.first_loss,
            "tokens_per_s": progress.tokens_per_s,
            "checkpoint_step": progress.metrics.get("checkpoint_step"),
            "local_s": progress.metrics.get("local_s"),
            "step_time_s": progress.metrics.get("step_time_s"),
            "memory_mb": progress.metrics.get("peak_memory_mb"),
            "comm_s": progress.metrics.get("comm_s"),
            "comm_bytes": progress.metrics.get("comm_bytes"),
            "reported_at": progress.reported_at,
            "stop_ack_s": self._stop_ack_s(),
            "stop_seen": self._ctx.stop_seen if self._ctx else False,
            "events": self._ctx.events() if self._ctx else (),
            "pid": os.getpid(),
        }

    def stop(self) -> None:
        if self._stop_at is None:
            self._stop_at = time.time()
        self._stop_event.set()

    def _stop_ack_s(self) -> float | None:
        if self._stop_at is None or self._ended_at is None:
            return None
        return max(0.0, self._ended_at - self._stop_at)

    def stacks(self) -> str:
        """Every thread's Python stack in this rank's process, for a hang report."""
        names = {t.ident: t.name for t in threading.enumerate()}
        parts = []
        for ident, frame in sys._current_frames().items():
            stack = "".join(traceback.format_stack(frame))
            parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
        return "\n".join(parts)

    def _run_script(
        self, ctx: RankContext, entrypoint: dict[str, Any], master_addr: str, master_port: int
    ) -> None:
        from workers.program.script import run_script

        try:
            run_script(ctx, entrypoint, master_addr=master_addr, master_port=master_port)
            self._succeed()
        except BaseException:
            self._fail()

    def _succeed(self) -> None:
        self._ended_at = time.time()
        self._phase = SUCCEEDED

    def _fail(self) -> None:
        self._failed_at = self._ended_at = time.time()
        self._error = traceback.format_exc(limit=20)
        self._phase = FAILED

    def _run(
        self, ctx: RankContext, init_method: str, entrypoint: dict[str, Any], timeout_s: float
    ) -> None:
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        try:
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=timedelta(seconds=timeout_s),
            )
            _run_entrypoint(ctx, entrypoint)
            self._succeed()
        except BaseException:
            self._fail()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def host_store(address: str, world_size: int, timeout_s: float = 600.0) -> Any:
    """The process-group store of a script gang, held by rank 0's actor as torchrun's
    agent holds it (on a free port, `.port`): the scripts connect as clients
    (TORCHELASTIC_USE_AGENT_STORE), so the store outlives every script, and a rank that
    tears down its process group after rank 0's script has exited still finds it."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        address,
        0,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _run_entrypoint(ctx: RankContext, entrypoint: dict[str, Any]) -> None:
    kind = entrypoint["kind"]
    if kind == "builtin":
        from workers.program.trainer import train_builtin

        train_builtin(ctx, entrypoint)
    elif kind == "function":
        from workers.program.entrypoints import resolve_function

        resolve_function(entrypoint["target"])(ctx, **entrypoint.get("kwargs", {}))
    else:
        raise ValueError(f"unknown entrypoint kind {kind!r}")
