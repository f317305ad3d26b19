"""The hybrid-parallel training loop: one optimizer step is visible end to end.

    batch slice -> forward/backward (pipeline schedule, or plain) -> sync grads (when no
    DDP/FSDP does it) -> clip -> global loss -> health check -> optimizer + LR step
    -> validation pass (every `eval_every` steps) -> report -> checkpoint

The health check (`workers.engine.health`) rides on the step's own collectives: the
global loss is all-reduced before the optimizer steps, with NaN from any rank whose
gradient norm is not finite, and every rank judges that same value. A bad step is acted
on as `on_instability` says (`_Recovery`).

Runs on any process group the caller set up (Ray rank actors, torchrun, tests); a single
process is the same code with a plan of 1 x 1 x 1, which is what loss parity compares to.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from gangway.models import Builtin, CheckpointPolicy, Optimizer, PauseBar, wire_default
from workers.engine import async_ps, async_worker, balance
from workers.engine.checkpoint import Checkpointer, is_rank0, stop_agreed
from workers.engine.data import SyntheticTokens, TokenFile, TokenStream
from workers.engine.device_stats import peak_flops, peak_memory_mb, rank_device, state_bytes
from workers.engine.evaluation import Evaluator, StepLoss
from workers.engine.gpt import parameter_count
from workers.engine.health import BadStep, InstabilityError, InstabilityPolicy, LossWatch
from workers.engine.model_configs import MODEL_CONFIGS, GPTConfig
from workers.engine.optim import build_optimizer, gradients_of, lr_schedule, parameters_of
from workers.engine.parallelize import ModelParts, build_mesh, build_parts
from workers.engine.plan import ParallelPlan, validate_plan
from workers.engine.rank_speed import BatchShares, LocalTimer
from workers.engine.stage_plan import stage_units
from workers.engine.updates import (
    AdaptivePeriod,
    CommMeter,
    DiLoCo,
    UpdateRule,
    build_rule,
    ddp_hook,
)

# The checkpoint counter that holds the data position (the next sample index).
NEXT_SAMPLE = "next_sample"
# The checkpoint counter of rollbacks so far (`on_instability`), across attempts.
ROLLBACKS = "rollbacks"

# An injected straggler's backward: twice its forward (two matmuls per forward matmul;
# measured on CPU: 1.86x gpt-mini, 1.97x gpt-tiny). Not measured in the run, as under DDP
# the backward's elapsed time includes waiting for the last gradient all-reduce.
BACKWARD_PER_FORWARD = 2.0


class Reporter(Protocol):
    """What the loop needs of its caller: `workers.program.context.RankContext` is one."""

    def should_stop(self) -> bool: ...

    def report(self, *, step: int, loss: float | None = None, **metrics: Any) -> None: ...

    def event(self, text: str) -> None: ...


@dataclass(frozen=True)
class TrainSpec:
    """What to train and how long. `batch_size` is per data-parallel rank and micro-step;
    one optimizer step sees dp x batch_size x grad_accumulation sequences."""

    model: str = wire_default(Builtin, "model")
    steps: int = wire_default(Builtin, "steps")
    batch_size: int = wire_default(Builtin, "batch_size")
    learning_rate: float = wire_default(Builtin, "learning_rate")
    warmup_steps: int = wire_default(Builtin, "warmup_steps")
    grad_accumulation: int = wire_default(Builtin, "grad_accumulation")
    max_grad_norm: float | None = wire_default(Builtin, "max_grad_norm")
    optimizer: Optimizer = wire_default(Builtin, "optimizer")  # sgd: plain, no momentum
    seed: int = wire_default(Builtin, "seed")
    data_path: str | None = wire_default(Builtin, "data_path")  # None: synthetic tokens
    checkpoint_interval_steps: int | None = wire_default(CheckpointPolicy, "interval_steps")
    keep_last: int = wire_default(CheckpointPolicy, "keep_last")
    eval_every: int | None = wire_default(Builtin, "eval_every")  # None: no validation
    eval_batches: int = wire_default(Builtin, "eval_batches")
    on_instability: InstabilityPolicy = field(default_factory=InstabilityPolicy)
    pause_at: Sequence[int] = field(default_factory=list)  # Builtin.pause_at (sync modes)
    pause_unless: Sequence[PauseBar] = field(default_factory=list)  # Builtin.pause_unless
    # The engine's own knobs, not in the job spec:
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    log_every: int = 10  # global rank 0 prints a progress line this often

    @property
    def config(self) -> GPTConfig:
        return MODEL_CONFIGS[self.model]


@dataclass
class TrainResult:
    step: int
    losses: list[float] = field(default_factory=list)
    resumed_from: int = 0
    stopped: bool = False


def train(
    reporter: Reporter,
    plan: ParallelPlan,
    spec: TrainSpec,
    *,
    checkpoint_dir: Path | None = None,
    own_checkpoint_dir: bool = False,
    init_dir: Path | None = None,
    slowdown: float = 1.0,
) -> TrainResult:
    """Train on the default process group (world = plan.world_size), resuming from the
    latest checkpoint in `checkpoint_dir` if there is one (`own_checkpoint_dir`: a
    directory of this rank's alone, see `Checkpointer`), else from the weights of the
    checkpoint `init_dir` (a registered model version) if given. `slowdown` > 1 makes this
    rank's compute that many times slower (an injected straggler, for tests and
    benchmarks)."""
    validate_plan(plan, spec.config, batch_size=spec.batch_size)
    device = rank_device()
    mesh = build_mesh(plan, device.type)
    loss_fn = StepLoss(spec.grad_accumulation)
    meter = CommMeter()
    dp_group = mesh.get_group("dp")
    parts = build_parts(
        plan,
        spec.config,
        mesh,
        device,
        seed=spec.seed,
        loss_fn=loss_fn,
        stage_units=stage_units(plan, spec, device, reporter),
        ddp_hook=ddp_hook(plan, dp_group, meter) if plan.dp > 1 else None,
    )
    # async: rank 0's master steps every rank's update in turn (dp x the steps of a sync
    # replica, serially), so it takes torch's fused AdamW: one kernel over all parameters.
    fused = plan.update_mode == "async" and plan.dp > 1
    optimizers = [build_optimizer(part, spec, fused=fused) for part in parts.parts]
    schedulers = [lr_schedule(opt, spec) for opt in optimizers]
    params = list(parameters_of(parts.parts))
    names = [name for part in parts.parts for name, _ in part.named_parameters()]
    rule = build_rule(plan, dp_group, meter, params, names)
    checkpointer = Checkpointer(
        checkpoint_dir,
        parts.parts,
        optimizers,
        spec.keep_last,
        extra=rule.outer_state(),
        own_directory=own_checkpoint_dir,
    )
    step = checkpointer.load_latest(NEXT_SAMPLE, ROLLBACKS, *_RULE_COUNTERS)
    if step == 0 and init_dir is not None:
        checkpointer.load_weights(init_dir)
        reporter.event("started from the weights its init_from names")
    _resume_rule(rule, params, checkpointer.counters, step)
    rollbacks = checkpointer.counters.get(ROLLBACKS, 0)
    _schedule_at(schedulers, spec, step, rollbacks)
    loop = _Loop(
        plan=plan,
        spec=spec,
        mesh=mesh,
        parts=parts,
        device=device,
        loss_fn=loss_fn,
        rule=rule,
        meter=meter,
        slowdown=slowdown,
        event=reporter.event,
    )
    loop.next_sample = _saved_position(checkpointer.counters, step, loop.samples_per_step)
    loop.rollbacks = rollbacks
    if step == 0 and init_dir is not None:
        _validate_start(reporter, loop)
    if plan.update_mode == "async" and plan.dp > 1:
        return _train_async(
            reporter,
            loop,
            checkpointer=checkpointer,
            optimizer=optimizers[0],
            scheduler=schedulers[0],
            step=step,
        )
    return _train_sync(
        reporter,
        loop,
        checkpointer=checkpointer,
        optimizers=optimizers,
        schedulers=schedulers,
        step=step,
    )


def _validate_start(reporter: Reporter, loop: _Loop) -> None:
    """A job that starts from other weights validates them before its first step and
    reports that as step 0: the baseline its training is measured against (a fine-tune's
    is the pretrained model's validation loss on this job's held-out split). Not in
    `async` mode, which has no validation passes."""
    evaluator = loop.evaluator()
    sync = loop.plan.update_mode != "async"
    if evaluator is not None and loop.spec.eval_every is not None and sync:
        reporter.report(step=0, **evaluator.run())


def _train_sync(
    reporter: Reporter,
    loop: _Loop,
    *,
    checkpointer: Checkpointer,
    optimizers: list[torch.optim.Optimizer],
    schedulers: list[torch.optim.lr_scheduler.LambdaLR],
    step: int,
) -> TrainResult:
    """Every mode but `async`: one step at a time on every rank, each step checked."""
    spec = loop.spec
    recovery = _Recovery(loop, checkpointer, schedulers, reporter.event)
    evaluator = loop.evaluator()
    if evaluator is None and spec.eval_every is not None:
        reporter.event("no validation passes: torch's ZB-V schedule has no forward-only pass")
    result = TrainResult(step=step, resumed_from=step)
    # The newest saved step goes out with every report, so the runtime can say how many
    # steps a stop or a crash loses.
    saved: dict[str, float] = {"checkpoint_step": step} if step else {}
    metrics: dict[str, float] = {}
    while step < spec.steps:
        if stop_agreed(reporter.should_stop()):
            result.stopped = True
            break
        step += 1
        metrics, bad = loop.step(step, optimizers)
        if bad is None:
            recovery.good_step()
        elif (restored := recovery.act(bad)) is not None:
            step = restored
            del result.losses[step - result.resumed_from :]  # one loss per step kept
            continue
        metrics["lr"] = optimizers[0].param_groups[0]["lr"]
        metrics |= recovery.counts()
        for scheduler in schedulers:
            scheduler.step()
        result.losses.append(metrics["loss"])
        if evaluator is not None and _evaluates_at(spec, step):
            metrics |= evaluator.run()
        interval = spec.checkpoint_interval_steps
        due = interval is not None and step % interval == 0
        if due and loop.save(checkpointer, step):
            saved = {"checkpoint_step": step}
        reporter.report(step=step, **metrics, **saved)
        first_of_attempt = step == result.resumed_from + 1
        if is_rank0() and (first_of_attempt or step == spec.steps or step % spec.log_every == 0):
            print(_progress_line(step, spec.steps, metrics), flush=True)
        if step in spec.pause_at and step < spec.steps:
            if (passed := _passed_bar(spec, step, metrics)) is None:
                reporter.event(f"paused at step {step} (pause_at): saved to be continued")
                break
            reporter.event(f"went on past step {step} (pause_at): {passed}")
    result.step = step
    ended = step > result.resumed_from or result.stopped
    if ended and loop.save(checkpointer, step):
        # at the end, and on a stop request (preemption notice)
        reporter.report(step=step, **metrics, checkpoint_step=step)
    return result


def _passed_bar(spec: TrainSpec, step: int, metrics: Mapping[str, float]) -> str | None:
    """Why the trainer goes on past this pause_at step, or None to stop there. Every
    rank must take the same way (one that stopped alone would leave its peers waiting in
    the next step's collectives), so where a bar applies the ranks agree, in one
    one-element all-reduce: any rank that did not pass stops them all."""
    bar = next((b for b in spec.pause_unless if b.step == step), None)
    if bar is None:
        return None
    value = metrics.get(bar.metric)
    passed = value is not None and math.isfinite(value) and _better(bar, value)
    if stop_agreed(not passed):
        return None
    if bar.better_than is None:
        return f"{bar.metric} {value:.6g}: the sweep lets any value go on"
    sign = "<" if bar.mode == "min" else ">"
    return f"{bar.metric} {value:.6g} {sign} {bar.better_than:.6g}, the sweep's bar"


def _better(bar: PauseBar, value: float) -> bool:
    if bar.better_than is None:
        return True
    return value < bar.better_than if bar.mode == "min" else value > bar.better_than


def _train_async(
    reporter: Reporter,
    loop: _Loop,
    *,
    checkpointer: Checkpointer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    step: int,
) -> TrainResult:
    """`async` (`workers.engine.async_ps`): the built model and optimizer are the master, rank
    0's serves; every rank computes on a copy. A step is one applied update. Neither
    health checks nor validation passes: no step has a global loss all ranks see, and
    the ranks do not step together."""
    spec, model = loop.spec, loop.parts.parts[0]
    worker = async_worker.Worker(
        model=copy.deepcopy(model),
        stream=loop.stream,
        batch_size=spec.batch_size,
        accumulation=spec.grad_accumulation,
        loss_fn=loop.loss_fn,
        max_grad_norm=spec.max_grad_norm,
        slowdown=loop.slowdown,
        device=loop.device,
    )
    server = async_ps.Server(
        model,
        optimizer,
        scheduler,
        version=step,
        next_sample=loop.next_sample,
        samples=worker.samples,
        max_staleness=loop.plan.max_staleness,
    )

    def save(at: int, next_sample: int) -> dict[str, float]:
        loop.next_sample = next_sample
        return {"checkpoint_step": at} if loop.save(checkpointer, at) else {}

    outcome = async_ps.train_async(
        worker,
        server,
        steps=spec.steps,
        checkpoint_interval=spec.checkpoint_interval_steps,
        reporter=reporter,
        save=save,
    )
    return TrainResult(outcome.step, outcome.losses, resumed_from=step, stopped=outcome.stopped)


class _Loop:
    def __init__(
        self,
        *,
        plan: ParallelPlan,
        spec: TrainSpec,
        mesh: Any,
        parts: ModelParts,
        device: torch.device,
        loss_fn: StepLoss,
        rule: UpdateRule,
        meter: CommMeter,
        slowdown: float,
        event: Callable[[str], None],
    ) -> None:
        self.plan, self.spec, self.mesh, self.parts = plan, spec, mesh, parts
        self.device, self.loss_fn = device, loss_fn
        self.rule, self.meter, self.slowdown = rule, meter, slowdown
        self.params = list(parameters_of(parts.parts))
        self.batch = BatchShares(
            plan.dp, plan.dp * spec.batch_size, enabled=plan.balance_batch, event=event
        )
        self.dp_rank = mesh.get_local_rank("dp")
        self.counts_loss = parts.last(plan) and mesh.get_local_rank("tp") == 0
        self.stream = _stream(spec)
        config = spec.config
        self.samples_per_step = plan.dp * spec.batch_size * spec.grad_accumulation
        self.tokens_per_step = self.samples_per_step * config.seq_len
        # The data position: samples every earlier step consumed, at whatever dp it ran.
        self.next_sample = 0
        self.flops_per_token = 6 * parameter_count(config)
        self.state_mb: float | None = None
        self.local = LocalTimer(device)
        policy = spec.on_instability
        self.watch = LossWatch(spike_factor=policy.spike_factor, spike_window=policy.spike_window)
        self.rollbacks = 0  # checkpointed with the data position

    def step(
        self, step: int, optimizers: list[torch.optim.Optimizer]
    ) -> tuple[dict[str, float], BadStep | None]:
        """One step; a bad one (`workers.engine.health`) is returned without its update
        applied, for the caller to act on."""
        started = time.perf_counter()
        self.loss_fn.poison_this_step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=self.device)
        global_batch = self.batch.global_batch
        shares = self.batch.shares
        for micro in range(self.spec.grad_accumulation):
            first_sample = self.next_sample + micro * global_batch
            start, count = balance.share_slice(first_sample, shares, self.dp_rank)
            inputs, targets = self.stream.samples(start, count)
            last_micro = micro == self.spec.grad_accumulation - 1
            # Each rank's mean loss weighted by its share: DDP's gradient average over
            # ranks is then the global batch's mean, however the batch is split.
            weight = count * self.plan.dp / global_batch
            loss += self._forward_backward(
                inputs.to(self.device), targets.to(self.device), last_micro, weight
            )
        self.next_sample += self.samples_per_step
        synced = time.perf_counter()
        self._sync_grads()
        grad_norm = self._clip()
        loss_value = self._global_loss(loss, grads_finite=math.isfinite(grad_norm))
        bad = self.watch.check(step, loss_value, grad_norm)
        if bad is None:
            for opt in optimizers:
                opt.step()
        # On a bad step too: a skipped step keeps the sync schedule; a rollback restores
        # whatever the rule changed.
        self.rule.after_step(step, self.params)
        sync_s = time.perf_counter() - synced
        elapsed = time.perf_counter() - started
        metrics = self._metrics(loss_value, grad_norm, elapsed, sync_s)
        local_s = self.local.total_s()  # after _global_loss's .item(): the events are done
        if local_s is not None:
            metrics["local_s"] = local_s
            self.batch.observe(step, local_s / shares[self.dp_rank], self.mesh.get_group("dp"))
        metrics["batch_share"] = float(shares[self.dp_rank])
        metrics |= self.rule.describe()
        if self.state_mb is None:  # fixed once the optimizer has made its state
            self.state_mb = state_bytes(self.parts.parts, optimizers) / 2**20
        metrics["state_mb"] = self.state_mb
        return metrics, bad

    def save(self, checkpointer: Checkpointer, step: int) -> bool:
        """Make the replicas equal (periodic modes), then checkpoint; False: no
        checkpoint directory."""
        if checkpointer.directory is None:
            return False
        self.rule.consolidate(self.params)
        counters = {NEXT_SAMPLE: self.next_sample, ROLLBACKS: self.rollbacks}
        if isinstance(self.rule, AdaptivePeriod):
            counters |= self.rule.counters()
        return checkpointer.save(step, **counters) is not None

    def evaluator(self) -> Evaluator | None:
        """Validation passes for this rank, on the held-out split of the training data.
        None under ZB-V: torch 2.13's `eval` runs its backward-input actions and fails."""
        if self.plan.pp > 1 and self.plan.pipeline_schedule == "zbv":
            return None
        return Evaluator(
            plan=self.plan,
            parts=self.parts,
            loss=self.loss_fn,
            stream=_stream(self.spec, validation=True),
            batch_size=self.spec.batch_size,
            batches=self.spec.eval_batches,
            dp_rank=self.dp_rank,
            counts=self.counts_loss,
            device=self.device,
            autocast=self._autocast,
        )

    def _forward_backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, last_micro: bool, weight: float
    ) -> torch.Tensor:
        with self._autocast():
            schedule = self.parts.schedule
            if schedule is not None:
                losses: list[torch.Tensor] = []
                args: tuple[torch.Tensor, ...] = ()
                if self.parts.first:  # a split head's middle stages need the targets too
                    args = (inputs, targets) if self.parts.carries_targets else (inputs,)
                target = targets if self.parts.last(self.plan) else None
                schedule.step(*args, target=target, losses=losses if target is not None else None)
                if not losses:
                    return torch.zeros((), device=self.device)
                return torch.stack([item.detach() for item in losses]).mean()
            ddp = self.parts.ddp
            model = ddp if ddp is not None else self.parts.parts[0]
            no_sync = (
                ddp.no_sync() if ddp is not None and not last_micro else contextlib.nullcontext()
            )
            with no_sync:
                with self.local.span():  # no peer takes part in a forward without TP/FSDP
                    began = time.perf_counter()
                    output = model(inputs)
                    forward_s = time.perf_counter() - began
                    self._straggle(forward_s)
                loss = self.loss_fn(output, targets) * weight
                self._straggle(BACKWARD_PER_FORWARD * forward_s)
                loss.backward()  # type: ignore[no-untyped-call]
            return loss.detach()

    def _straggle(self, work_s: float) -> None:
        """An injected straggler: `work_s` of compute takes `slowdown` x as long. The
        backward's share is slept before it starts, as a slow device's gradients come
        late: slept after, it would overlap DDP's all-reduce (launched during backward,
        waited for at its end) and hide the communication a real straggler delays."""
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * work_s)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast where FSDP's mixed-precision policy does not already cast."""
        enabled = self.plan.precision == "bf16" and not self.plan.fsdp
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _sync_grads(self) -> None:
        """Average gradients over the data-parallel axis where neither DDP nor FSDP does:
        data parallel combined with tensor or pipeline parallel without FSDP."""
        if self.plan.dp == 1 or self.plan.fsdp or self.parts.ddp is not None:
            return
        group = self.mesh.get_group("dp")
        for grad in gradients_of(self.parts.parts):
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            with self.meter.timed(local.numel() * local.element_size()):
                dist.all_reduce(local, group=group)
            local /= self.plan.dp

    def _clip(self) -> float:
        """Global gradient norm over every shard and stage; clip to `max_grad_norm`.
        By torch's multi-tensor norm, once per kind of gradient: plain ones, and sharded
        ones (DTensor) per mesh and placement, each kind's norm made whole by one
        collective (a full norm per sharded tensor would be one collective each)."""
        grads = list(gradients_of(self.parts.parts))
        kinds: dict[Any, list[torch.Tensor]] = {}
        for grad in grads:
            kind = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
            kinds.setdefault(kind, []).append(grad)
        squares = torch.zeros((), device=self.device)
        for group in kinds.values():
            norm = torch.nn.utils.get_total_norm(group)
            squares += (norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2
        if self.plan.pp > 1:
            dist.all_reduce(squares, group=self.mesh.get_group("pp"))
        total = float(squares.sqrt().item())
        limit = self.spec.max_grad_norm
        if limit is not None and total > limit:
            # By hand, as a Python float: torch's clip helpers refuse a mix of DTensor
            # (sharded) and plain (replicated) gradients, which TP without FSDP has.
            scale = limit / (total + 1e-6)
            for grad in grads:
                grad.mul_(scale)
        return total

    def _global_loss(self, loss: torch.Tensor, *, grads_finite: bool) -> float:
        """The step's loss over the whole global batch: the last stage's tp-rank-0 losses,
        averaged over data-parallel ranks (one small all-reduce over the world). A rank
        whose gradient norm is not finite adds NaN, so that every rank sees it (under
        local-sgd, diloco and adaptive the ranks' gradients differ)."""
        value = loss if self.counts_loss else torch.zeros_like(loss)
        if not grads_finite:
            value = torch.full_like(loss, math.nan)
        if dist.is_initialized() and dist.get_world_size() > 1:
            value = value.clone()
            dist.all_reduce(value)
        return float(value.item()) / self.plan.dp

    def _metrics(
        self, loss: float, grad_norm: float, elapsed: float, sync_s: float
    ) -> dict[str, float]:
        tokens_per_s = self.tokens_per_step / elapsed
        comm_s, comm_bytes = self.meter.take()
        metrics = {
            "loss": loss,
            "tokens_per_s": tokens_per_s,
            "step_time_s": elapsed,
            "sync_s": sync_s,
            # Time in data-parallel collectives (DDP's buckets from launch to done, so
            # it may overlap the backward pass) and their payload bytes from this rank.
            "comm_s": comm_s,
            "comm_bytes": float(comm_bytes),
            "compute_s": max(0.0, elapsed - comm_s),
            "grad_norm": grad_norm,
            "peak_memory_mb": peak_memory_mb(self.device),
        }
        peak = peak_flops(self.device)
        if peak is not None:
            # 6 N flops per token (forward + backward), the usual MFU estimate
            metrics["mfu"] = self.flops_per_token * tokens_per_s / (peak * self.plan.world_size)
        return metrics


def _progress_line(step: int, steps: int, metrics: dict[str, float]) -> str:
    return (
        f"step {step}/{steps} loss {metrics['loss']:.4f} "
        f"tokens/s {metrics['tokens_per_s']:,.0f} step {metrics['step_time_s'] * 1000:.0f} ms "
        f"grad norm {metrics['grad_norm']:.3f} lr {metrics['lr']:.2e}"
    )


class _Recovery:
    """Acts on a bad step as `on_instability` says (`gangway.models.Instability`), the
    same on every rank (they judged the same loss); every action is an event.

    - `fail`: raise, naming the step and the value.
    - `skip`: the update is dropped (the next step zeroes the gradients). The step still
      counts: the data position has moved on, the LR schedule steps and the update rule
      syncs on schedule, as the LR is a function of the step and a resume relies on it.
    - `rollback`: restore the newest checkpoint in place and go on from its step with
      the data after the bad step's batch (the window between is skipped, as PaLM does),
      the learning rate x `lr_scale` per rollback. The count goes into checkpoints
      (`ROLLBACKS`), so `max_rollbacks` holds across attempts (a rollback after the
      newest save is counted again by an attempt that resumes from it). With no
      checkpoint yet, it skips.

    Skipping gives up after `spike_window` bad steps in a row: a loss that settled at a
    new level never joins the window, and a run that applies no update must not end as
    if it trained.
    """

    def __init__(
        self,
        loop: _Loop,
        checkpointer: Checkpointer,
        schedulers: list[torch.optim.lr_scheduler.LambdaLR],
        event: Callable[[str], None],
    ) -> None:
        self.loop, self.checkpointer = loop, checkpointer
        self.schedulers, self.event = schedulers, event
        self.policy = loop.spec.on_instability
        self.skipped = 0  # this attempt's
        self.in_a_row = 0  # bad steps since the last good one

    def act(self, bad: BadStep) -> int | None:
        """The step rolled back to, or None: the step stands without its update."""
        if self.policy.action == "fail":
            raise InstabilityError(f"{bad}; on_instability=fail")
        if self.policy.action == "rollback":
            used = self.loop.rollbacks
            if used >= self.policy.max_rollbacks:
                noun = "rollback" if used == 1 else "rollbacks"
                raise InstabilityError(f"{bad}; {used} {noun} did not help")
            restored = self._rollback(bad)
            if restored is not None:
                return restored
            self.event(f"instability at {bad}; no checkpoint to roll back to yet, update skipped")
        else:
            self.event(f"instability at {bad}; update skipped")
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= self.policy.spike_window:
            raise InstabilityError(f"{bad}; {self.in_a_row} bad steps in a row were skipped")
        return None

    def good_step(self) -> None:
        self.in_a_row = 0

    def counts(self) -> dict[str, float]:
        return {"rollbacks": float(self.loop.rollbacks), "skipped_steps": float(self.skipped)}

    def _rollback(self, bad: BadStep) -> int | None:
        """Restore the newest checkpoint; its step (None: there is none)."""
        loop = self.loop
        step = self.checkpointer.load_latest(NEXT_SAMPLE, *_RULE_COUNTERS)
        if step == 0:
            return None
        loop.rollbacks += 1
        counters = self.checkpointer.counters
        _resume_rule(loop.rule, loop.params, counters, step)
        _schedule_at(self.schedulers, loop.spec, step, loop.rollbacks)
        loop.watch.clear()
        skipped_from = _saved_position(counters, step, loop.samples_per_step)
        self.event(
            f"instability at {bad}; rolled back to step {step}, skipping samples "
            f"{skipped_from}-{loop.next_sample - 1}, "
            f"lr x{self.policy.lr_scale**loop.rollbacks:g} "
            f"(rollback {loop.rollbacks} of {self.policy.max_rollbacks})"
        )
        return step


def _evaluates_at(spec: TrainSpec, step: int) -> bool:
    """Every `eval_every` steps and at the last."""
    every = spec.eval_every
    return every is not None and (step % every == 0 or step == spec.steps)


def _saved_position(counters: dict[str, int], step: int, samples_per_step: int) -> int:
    """The data position a checkpoint holds; checkpoints written before the position was
    saved ran at this plan's batch."""
    return counters.get(NEXT_SAMPLE, step * samples_per_step)


def _schedule_at(
    schedulers: list[torch.optim.lr_scheduler.LambdaLR], spec: TrainSpec, step: int, rollbacks: int
) -> None:
    """Put the LR schedules at `step` after a load (at the start, on a rollback), the peak
    x `lr_scale` per rollback so far. The schedule is closed-form (LambdaLR), so one
    step from `step - 1` lands where `step` steps from 0 do."""
    peak = spec.learning_rate * spec.on_instability.lr_scale**rollbacks
    for scheduler in schedulers:
        scheduler.base_lrs = [peak] * len(scheduler.base_lrs)
        scheduler.last_epoch = step - 1
        with warnings.catch_warnings():  # placed, not stepped in training
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            scheduler.step()


def _stream(spec: TrainSpec, *, validation: bool = False) -> TokenStream:
    config = spec.config
    if spec.data_path:
        return TokenFile(spec.data_path, seq_len=config.seq_len, validation=validation)
    return SyntheticTokens(
        vocab_size=config.vocab_size,
        seq_len=config.seq_len,
        seed=spec.seed,
        validation=validation,
    )


_RULE_COUNTERS = ("sync_period", "next_sync")


def _resume_rule(
    rule: UpdateRule, params: list[nn.Parameter], counters: dict[str, int], step: int
) -> None:
    """After a load, the parameters are the synchronised ones (saved after consolidate)."""
    if isinstance(rule, DiLoCo):
        rule.reset_anchor(params)
    if isinstance(rule, AdaptivePeriod):
        rule.restore(counters, step)
