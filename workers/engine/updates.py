"""How data-parallel replicas combine their work, and what that costs in communication.

- `sync`: DDP all-reduces every gradient bucket in the backward pass (today's engine).
- `local-sgd`: DDP with torch's post-local-SGD hook (no gradient all-reduce) and torch's
  `PeriodicModelAverager`, which all-reduces the parameters every `sync_period` steps.
- `diloco`: local steps as above; every `sync_period` steps the averaged change from the
  last synchronised parameters is the gradient of an outer SGD with Nesterov momentum
  (Douillard et al. 2023; torchft's `DiLoCo` is the same design).
- `adaptive`: local SGD whose period follows the replicas' drift (see `AdaptivePeriod`).

Every mode can `consolidate()`: make the replicas equal now. The trainer does before each
checkpoint, so a checkpoint (one copy of replicated tensors, as DCP writes them) holds all
replicas' progress and resumes at any data-parallel degree (elastic resize).

`CommMeter` counts what a rank puts into data-parallel collectives each step: seconds
from launch to completion and payload bytes. DDP's buckets are timed by wrapping its comm
hook; in-flight time of a bucket overlaps the rest of the backward pass, so `comm_s` is
time in collectives, not time added to the step.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.algorithms.model_averaging import utils as averaging
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from workers.engine.parallelize import plan_comm_hook
from workers.engine.plan import ParallelPlan

# Bytes on the wire per element, for DDP's compression hooks (PowerSGD is not counted).
_WIRE_BYTES = {"none": 4, "fp16": 2, "bf16": 2}


class CommMeter:
    """Seconds and bytes in data-parallel collectives since the last `take()`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.bytes = 0

    @contextlib.contextmanager
    def timed(self, payload_bytes: int) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.seconds += time.perf_counter() - began
        self.bytes += payload_bytes

    def take(self) -> tuple[float, int]:
        taken = (self.seconds, self.bytes)
        self.seconds, self.bytes = 0.0, 0
        return taken


def metered_hook(
    meter: CommMeter, hook: Callable[[Any, Any], torch.futures.Future[torch.Tensor]], wire: int
) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
    """Wrap a DDP comm hook: count each bucket's payload and time it until its future
    completes. `wire` is bytes per element as sent (0: not counted)."""

    def hook_fn(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
        began = time.perf_counter()
        fut = hook(state, bucket)
        sent = bucket.buffer().numel() * wire

        def done(result: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            meter.seconds += time.perf_counter() - began
            meter.bytes += sent
            return result.value()

        return fut.then(done)

    # DDP checks the hook's annotations against the classes themselves.
    hook_fn.__annotations__.update(
        bucket=dist.GradBucket,  # type: ignore[attr-defined]
        **{"return": torch.futures.Future[torch.Tensor]},
    )
    return hook_fn


def ddp_hook(
    plan: ParallelPlan, group: dist.ProcessGroup, meter: CommMeter
) -> tuple[Any, Callable[..., Any]]:
    """DDP's comm hook for the update mode. Periodic modes: torch's post-local-SGD hook
    from step 0 without local gradient all-reduce, so each replica keeps its own
    gradient (the rule averages parameters instead). `sync`: the plan's compression hook
    or a plain all-reduce, metered."""
    if plan.update_mode != "sync":
        local = PostLocalSGDState(  # type: ignore[no-untyped-call]
            process_group=group,
            subgroup=None,
            start_localSGD_iter=0,
            post_local_gradient_allreduce=False,
        )
        return local, post_localSGD_hook
    state, hook = plan_comm_hook(plan, group) or (group, default_hooks.allreduce_hook)
    return state, metered_hook(meter, hook, _WIRE_BYTES.get(plan.grad_compression, 0))


class UpdateRule:
    """`sync`: DDP did the work in the backward pass; nothing after the optimizer."""

    def __init__(self, group: dist.ProcessGroup | None, meter: CommMeter) -> None:
        self.group, self.meter = group, meter

    def after_step(self, step: int, params: Sequence[nn.Parameter]) -> None:
        """Called once every rank's optimizer has taken global step `step` (1-based)."""

    def consolidate(self, params: Sequence[nn.Parameter]) -> None:
        """Make every replica hold the same parameters (before a checkpoint)."""

    def outer_state(self) -> dict[str, torch.Tensor]:
        """Tensors a checkpoint keeps for this rule, restored in place on load."""
        return {}

    def describe(self) -> dict[str, float]:
        return {}

    def _average(self, params: Sequence[nn.Parameter]) -> None:
        """torch's parameter averaging (one flat all-reduce), metered."""
        size = sum(p.numel() * p.element_size() for p in params)
        with self.meter.timed(size):
            averaging.average_parameters(iter(params), self.group)  # type: ignore[arg-type]


class LocalSGD(UpdateRule):
    """Average the parameters every `period` steps with `PeriodicModelAverager`."""

    def __init__(self, group: dist.ProcessGroup | None, meter: CommMeter, *, period: int) -> None:
        super().__init__(group, meter)
        with warnings.catch_warnings():  # period 1 is legal; torch only advises DDP then
            warnings.filterwarnings("ignore", message="When period is 1")
            self.averager = PeriodicModelAverager(period=period, process_group=group)

    def after_step(self, step: int, params: Sequence[nn.Parameter]) -> None:
        self.averager.step = step  # the global step: a resumed run keeps the period's phase
        if step % self.averager.period == 0:
            size = sum(p.numel() * p.element_size() for p in params)
            with self.meter.timed(size):
                self.averager.average_parameters(params)

    def consolidate(self, params: Sequence[nn.Parameter]) -> None:
        self._average(params)

    def describe(self) -> dict[str, float]:
        return {"sync_period": float(self.averager.period)}


class DiLoCo(UpdateRule):
    """Outer step every `period` steps: the averaged replicas' change since the last
    sync, anchor - mean(params), is the outer gradient of SGD with Nesterov momentum on
    the anchor; every replica then restarts from the new anchor."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        meter: CommMeter,
        params: Sequence[nn.Parameter],
        *,
        names: Sequence[str],
        period: int,
        lr: float,
        momentum: float,
    ) -> None:
        super().__init__(group, meter)
        self.names = list(names)  # the parameters' names, which key the saved momentum
        self.period = period
        self.anchor = [nn.Parameter(p.detach().clone()) for p in params]
        self.outer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=True)
        for anchor in self.anchor:  # zeros behave as torch's first-step buffer (= grad)
            self.outer.state[anchor]["momentum_buffer"] = torch.zeros_like(anchor)

    def after_step(self, step: int, params: Sequence[nn.Parameter]) -> None:
        if step % self.period == 0:
            self.consolidate(params)

    def consolidate(self, params: Sequence[nn.Parameter]) -> None:
        self._average(params)
        with torch.no_grad():
            for anchor, param in zip(self.anchor, params, strict=True):
                anchor.grad = anchor.detach() - param.detach()
            self.outer.step()
            for anchor, param in zip(self.anchor, params, strict=True):
                param.copy_(anchor)

    def outer_state(self) -> dict[str, torch.Tensor]:
        """The anchor equals the parameters after `consolidate`; the momentum does not.
        Keyed by parameter name (releases before 2026-12-02 keyed it by position:
        `workers.engine.checkpoint_compat` reads those)."""
        state = self.outer.state
        buffers = [state[anchor]["momentum_buffer"] for anchor in self.anchor]
        return {f"outer_momentum.{n}": b for n, b in zip(self.names, buffers, strict=True)}

    def reset_anchor(self, params: Sequence[nn.Parameter]) -> None:
        """After a checkpoint load: the loaded parameters are the synchronised ones."""
        with torch.no_grad():
            for anchor, param in zip(self.anchor, params, strict=True):
                anchor.copy_(param)

    def describe(self) -> dict[str, float]:
        return {"sync_period": float(self.period)}


class AdaptivePeriod(UpdateRule):
    """Local SGD with a period that follows the replicas' drift (AdaComm-like).

    Rule, at each sync: drift = sqrt(mean over ranks of |theta_r - mean|^2) / |mean|,
    the replicas' relative spread just before averaging. drift < target / 2: the
    replicas stay close, double the period (at most 8x the initial one); drift > target:
    they drift apart, halve it (at least 1). AdaComm (Wang & Joshi 2019) shrinks the
    period as the loss falls; measuring the divergence it guards against directly costs
    one extra scalar all-reduce per sync.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, meter: CommMeter, *, period: int, target: float
    ) -> None:
        super().__init__(group, meter)
        self.initial, self.period, self.target = period, period, target
        self.next_sync = period
        self.drift = 0.0

    def after_step(self, step: int, params: Sequence[nn.Parameter]) -> None:
        if step < self.next_sync:
            return
        self.drift = self._average_measuring_drift(params)
        if self.drift < self.target / 2:
            self.period = min(self.period * 2, self.initial * 8)
        elif self.drift > self.target:
            self.period = max(self.period // 2, 1)
        self.next_sync = step + self.period

    def consolidate(self, params: Sequence[nn.Parameter]) -> None:
        self._average(params)

    def _average_measuring_drift(self, params: Sequence[nn.Parameter]) -> float:
        before = torch.cat([p.detach().reshape(-1) for p in params])
        self._average(params)
        after = torch.cat([p.detach().reshape(-1) for p in params])
        spread = torch.stack([(before - after).square().sum(), after.square().sum()])
        with self.meter.timed(spread.numel() * spread.element_size()):
            dist.all_reduce(spread, group=self.group)
        world = dist.get_world_size(self.group)
        return math.sqrt(float(spread[0]) / world) / max(math.sqrt(float(spread[1]) / world), 1e-12)

    def counters(self) -> dict[str, int]:
        return {"sync_period": self.period, "next_sync": self.next_sync}

    def restore(self, counters: dict[str, int], step: int) -> None:
        self.period = counters.get("sync_period", self.period)
        self.next_sync = counters.get("next_sync", step + self.period)

    def describe(self) -> dict[str, float]:
        return {"sync_period": float(self.period), "drift": self.drift}


def build_rule(
    plan: ParallelPlan,
    group: dist.ProcessGroup | None,
    meter: CommMeter,
    params: Sequence[nn.Parameter],
    names: Sequence[str],
) -> UpdateRule:
    """The rule for `plan.update_mode`; `names`: the parameters' names."""
    if plan.dp == 1 or plan.update_mode in ("sync", "async"):  # async: workers.engine.async_ps
        return UpdateRule(group, meter)
    if plan.update_mode == "local-sgd":
        return LocalSGD(group, meter, period=plan.sync_period)
    if plan.update_mode == "diloco":
        return DiLoCo(
            group,
            meter,
            params,
            names=names,
            period=plan.sync_period,
            lr=plan.outer_lr,
            momentum=plan.outer_momentum,
        )
    return AdaptivePeriod(group, meter, period=plan.sync_period, target=plan.drift_target)
