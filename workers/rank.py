"""The rank actor: one per rank of a gang, running the job's entrypoint in a thread.

`start()` returns at once and the entrypoint runs in a thread, so the runtime polls
`status()` instead of holding an ObjectRef to a long call. That is what lets a restarted
service reattach to ranks that kept running: the status lives in the (detached) actor, not
in the service's memory.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

from workers.context import RankContext, RankInfo

# Phases a rank reports; the group aggregates them.
IDLE, RUNNING, SUCCEEDED, FAILED = "idle", "running", "succeeded", "failed"


class RankActor:
    def __init__(self) -> None:
        # Import the heavy parts now, while the gang is still assembling: the first DDP(...)
        # imports torch._dynamo lazily (~4 s), which would otherwise stall step 1.
        import torch._dynamo
        import torch.distributed  # noqa: F401

        self._stop_event = threading.Event()
        self._phase = IDLE
        self._error: str | None = None
        self._failed_at: float | None = None
        self._ctx: RankContext | None = None
        self._thread: threading.Thread | None = None

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port: rank 0 hosts the process-group store."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), int(port)

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
        _set_torchrun_env(info, master_addr, master_port)
        self._ctx = RankContext(info, self._stop_event)
        self._phase = RUNNING
        self._thread = threading.Thread(
            target=self._run,
            args=(self._ctx, f"tcp://{master_addr}:{master_port}", entrypoint, timeout_s),
            name=f"rank-{info.rank}",
            daemon=True,
        )
        self._thread.start()
        return str(ray.get_runtime_context().get_node_id())

    def status(self) -> dict[str, Any]:
        progress = self._ctx.progress() if self._ctx else None
        return {
            "phase": self._phase,
            "error": self._error,
            "failed_at": self._failed_at,
            "step": progress.step if progress else 0,
            "loss": progress.loss if progress else None,
            "first_loss": progress.first_loss if progress else None,
            "tokens_per_s": progress.tokens_per_s if progress else None,
            "reported_at": progress.reported_at if progress else 0.0,
            "pid": os.getpid(),
        }

    def stop(self) -> None:
        self._stop_event.set()

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
            self._phase = SUCCEEDED
        except BaseException:
            self._failed_at = time.time()
            self._error = traceback.format_exc(limit=20)
            self._phase = FAILED
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _run_entrypoint(ctx: RankContext, entrypoint: dict[str, Any]) -> None:
    kind = entrypoint["kind"]
    if kind == "builtin":
        from workers.trainer import BuiltinSpec, train_builtin

        train_builtin(ctx, BuiltinSpec.from_entrypoint(entrypoint))
    elif kind == "function":
        from workers.entrypoints import resolve_function

        resolve_function(entrypoint["target"])(ctx, **entrypoint.get("kwargs", {}))
    else:
        raise ValueError(f"unknown entrypoint kind {kind!r}")


def _set_torchrun_env(info: RankInfo, master_addr: str, master_port: int) -> None:
    """Set the variables torchrun sets, so user code written for torchrun finds them."""
    os.environ.update(
        RANK=str(info.rank),
        WORLD_SIZE=str(info.world_size),
        LOCAL_RANK=str(info.local_rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
