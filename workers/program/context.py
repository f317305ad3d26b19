"""What a rank's entrypoint sees: who it is, how to report, and whether to stop.

In the rank program every report and event also goes to the supervisor over the report
channel (`workers.channel`); in tests and benchmarks that run the engine directly, the
context keeps them in memory only."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gangway.models import CheckpointPolicy, wire_default
from workers.channel import EventReport, ProgressReport, ReportSender, StopSeenReport
from workers.launch import RankInfo

# Bounds on `RankContext.event`: the lines are the job's (its code may be anyone's).
MAX_EVENTS = 50
MAX_EVENT_CHARS = 1000


@dataclass
class Progress:
    """The latest metrics a rank reported."""

    step: int = 0
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reported_at: float = 0.0


class RankContext:
    """Handed to function entrypoints as `fn(ctx, **kwargs)`.

    `report()` is cheap (memory, and one datagram to the supervisor when there is one), so
    calling it every step costs nothing measurable; `should_stop()` turns True when the
    runtime asks the rank to stop (cancel, preemption notice). `outputs_dir` is where the
    rank writes what its owner should get back (collected into the service's storage);
    `model_dir` holds the registered model version the job starts from (`init_from`).
    """

    def __init__(
        self,
        info: RankInfo,
        stop_event: threading.Event,
        *,
        checkpoint_dir: Path | None = None,
        own_checkpoint_dir: bool = False,
        keep_last: int = wire_default(CheckpointPolicy, "keep_last"),
        outputs_dir: Path | None = None,
        model_dir: Path | None = None,
        sink: ReportSender | None = None,
    ) -> None:
        self.info = info
        self.checkpoint_dir = checkpoint_dir  # the job's, the same on every attempt
        # ... or this rank's own on its host, its supervisor syncing it with the store
        self.own_checkpoint_dir = own_checkpoint_dir
        self.outputs_dir = outputs_dir
        self.model_dir = model_dir  # the files of the model version it starts from
        self._sink = sink
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

        return Checkpointer(
            self.checkpoint_dir,
            parts,
            optimizers,
            self._keep_last,
            own_directory=self.own_checkpoint_dir,
        )

    def should_stop(self) -> bool:
        """This rank was asked to stop. Its peers may learn it a step later: before a
        collective such as a checkpoint, use `should_stop_together()`."""
        if self._stop_event.is_set():
            self._saw_stop()
        return self.stop_seen

    def _saw_stop(self) -> None:
        if not self.stop_seen and self._sink is not None:
            self._sink.send(StopSeenReport())
        self.stop_seen = True

    def should_stop_together(self) -> bool:
        """Whether any rank was asked to stop, the same answer on every rank. A
        collective: every rank calls it at the same point of each step."""
        from workers.engine.checkpoint import stop_agreed

        if stop_agreed(self.should_stop()):
            self._saw_stop()
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
        if self._sink is not None:
            numbers = {
                k: float(v)
                for k, v in metrics.items()
                if isinstance(v, int | float) and math.isfinite(v)
            }
            self._sink.send(
                ProgressReport(step=step, loss=loss, tokens_per_s=tokens_per_s, metrics=numbers)
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
            if len(self._events) >= MAX_EVENTS:
                return
            self._events.append(text[:MAX_EVENT_CHARS])
        if self._sink is not None:
            self._sink.send(EventReport(text=text[:MAX_EVENT_CHARS]))

    def events(self) -> tuple[str, ...]:
        """Every event line this attempt, oldest first."""
        with self._lock:
            return tuple(self._events)
