"""What a rank's entrypoint sees: who it is, how to report, and whether to stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gangway.models import CheckpointPolicy, wire_default


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    dp: int
    tp: int
    pp: int
    local_world_size: int = 1


# Bounds on `RankContext.event`: the lines are the job's (its code may be anyone's).
MAX_EVENTS = 50
MAX_EVENT_CHARS = 1000


@dataclass
class Progress:
    """The latest metrics a rank reported; read by the runtime through `RankActor.status`."""

    step: int = 0
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reported_at: float = 0.0


class RankContext:
    """Handed to function entrypoints as `fn(ctx, **kwargs)`.

    `report()` is cheap (it only updates memory the actor serves on request), so calling it
    every step costs nothing; `should_stop()` turns True when the runtime asks the rank to
    stop (cancel, preemption notice).
    """

    def __init__(
        self,
        info: RankInfo,
        stop_event: threading.Event,
        *,
        checkpoint_dir: Path | None = None,
        keep_last: int = wire_default(CheckpointPolicy, "keep_last"),
    ) -> None:
        self.info = info
        self.checkpoint_dir = checkpoint_dir  # the job's, the same on every attempt
        self._keep_last = keep_last
        self._stop_event = stop_event
        # The entrypoint has been told to stop (`should_stop*` answered True): an
        # entrypoint that returns without ever being told finished its work.
        self.stop_seen = False
        self._lock = threading.Lock()
        self._progress = Progress()
        self._events: list[str] = []

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def local_rank(self) -> int:
        return self.info.local_rank

    @cached_property
    def mesh(self) -> Any:
        """A DeviceMesh (pp, dp, tp) over the job's ranks, built on first use."""
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        device = "cuda" if torch.cuda.is_available() else "cpu"
        shape = (self.info.pp, self.info.dp, self.info.tp)
        return init_device_mesh(device, shape, mesh_dim_names=("pp", "dp", "tp"))

    def checkpointer(self, parts: Sequence[Any], optimizers: Sequence[Any]) -> Any:
        """A `workers.engine.checkpoint.Checkpointer` for this job's model parts and their
        optimizers (one each): `load_latest()` on start, `save(step)` when
        `should_stop_together()` turns True and at the end. It does nothing when the job
        has no directory."""
        from workers.engine.checkpoint import Checkpointer

        return Checkpointer(self.checkpoint_dir, parts, optimizers, self._keep_last)

    def should_stop(self) -> bool:
        """This rank was asked to stop. Its peers may learn it a step later: before a
        collective such as a checkpoint, use `should_stop_together()`."""
        if self._stop_event.is_set():
            self.stop_seen = True
        return self.stop_seen

    def should_stop_together(self) -> bool:
        """Whether any rank was asked to stop, the same answer on every rank. A
        collective: every rank calls it at the same point of each step."""
        from workers.engine.checkpoint import stop_agreed

        if stop_agreed(self.should_stop()):
            self.stop_seen = True
        return self.stop_seen

    def report(
        self,
        *,
        step: int,
        loss: float | None = None,
        tokens_per_s: float | None = None,
        **metrics: float,
    ) -> None:
        with self._lock:
            first_loss = (
                self._progress.first_loss if self._progress.first_loss is not None else loss
            )
            self._progress = Progress(
                step, loss, first_loss, tokens_per_s, dict(metrics), time.time()
            )

    def progress(self) -> Progress:
        with self._lock:
            return self._progress

    def event(self, text: str) -> None:
        """A line for the job's event timeline (rank 0's are recorded), for what the job's
        owner should find beside its state changes: how the trainer split its pipeline
        stages, a change of batch shares. Cheap like `report`; at most `MAX_EVENTS` per
        attempt, each cut to `MAX_EVENT_CHARS`."""
        with self._lock:
            if len(self._events) < MAX_EVENTS:
                self._events.append(text[:MAX_EVENT_CHARS])

    def events(self) -> tuple[str, ...]:
        """Every event line this attempt, oldest first."""
        with self._lock:
            return tuple(self._events)
