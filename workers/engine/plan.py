"""The parallel plan of a training job, checked before any process starts.

No torch here: the API validates a submission with the same checks the ranks rely on, so a
plan that cannot work is a 422 naming the field, not a crash on eight GPUs an hour later.
Field names in errors are the job spec's (`parallelism.tp`, `entrypoint.microbatches`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gangway.models import (
    TWO_CHUNK_SCHEDULES,
    Builtin,
    Compression,
    Parallelism,
    PipelineSchedule,
    Precision,
    UpdateMode,
    wire_default,
)
from workers.engine.model_configs import GPTConfig


class PlanError(ValueError):
    """A plan that cannot run; `field` is the job-spec path of the value at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class ParallelPlan:
    """How the ranks split the work. The mesh is (pp, dp, tp), tp innermost: a tensor-
    parallel group is consecutive ranks, which the scheduler places on one node.

    fsdp: shard parameters, gradients and optimizer state over the data-parallel axis
        (FSDP2, ZeRO-3 style) instead of replicating them (DDP).
    microbatches: per optimizer step and data-parallel rank, for the pipeline schedule.
    grad_compression: a DDP communication hook (pure data parallel only).
    sequence_parallel: with tp > 1, shard the residual stream and norms over the
        sequence too (Megatron-SP).
    update_mode: how data-parallel replicas combine their work (`workers.engine.updates`):
        `sync` all-reduces gradients every step; `local-sgd` steps alone and averages
        parameters every `sync_period` steps; `diloco` also takes an outer Nesterov step
        (`outer_lr`, `outer_momentum`) over the averaged change; `adaptive` is local SGD
        whose period grows while the replicas stay within `drift_target` of each other;
        `async` pushes gradients to a parameter server on rank 0, which drops any computed
        on parameters more than `max_staleness` updates old (`workers.engine.async_ps`).
    balance_stages: split pipeline stages by each layer's measured cost, not its count.
    balance_batch: give persistently slower data-parallel ranks a smaller share of the
        global batch (the same global batch, so the same loss).
    """

    dp: int = wire_default(Parallelism, "dp")
    tp: int = wire_default(Parallelism, "tp")
    pp: int = wire_default(Parallelism, "pp")
    fsdp: bool = wire_default(Parallelism, "fsdp")
    microbatches: int = wire_default(Builtin, "microbatches")
    pipeline_schedule: PipelineSchedule = wire_default(Builtin, "pipeline_schedule")
    precision: Precision = wire_default(Builtin, "precision")
    grad_compression: Compression = wire_default(Builtin, "grad_compression")
    activation_checkpointing: bool = wire_default(Builtin, "activation_checkpointing")
    sequence_parallel: bool = wire_default(Builtin, "sequence_parallel")
    update_mode: UpdateMode = wire_default(Builtin, "update_mode")
    sync_period: int = wire_default(Builtin, "sync_period")
    outer_lr: float = wire_default(Builtin, "outer_lr")
    outer_momentum: float = wire_default(Builtin, "outer_momentum")
    drift_target: float = wire_default(Builtin, "drift_target")
    max_staleness: int = wire_default(Builtin, "max_staleness")
    balance_stages: bool = wire_default(Builtin, "balance_stages")
    balance_batch: bool = wire_default(Builtin, "balance_batch")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def stages_per_rank(self) -> int:
        """Interleaved 1F1B and ZB-V give each pipeline rank two model chunks (virtual
        stages)."""
        return 2 if self.pp > 1 and self.pipeline_schedule in TWO_CHUNK_SCHEDULES else 1

    @property
    def v_shape(self) -> bool:
        """ZB-V places pipeline rank r's chunks at stages r and 2 pp - 1 - r, so rank 0
        holds both ends: the embeddings and the head."""
        return self.pp > 1 and self.pipeline_schedule == "zbv"

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The pipeline stages `pp_rank` runs, in the order the schedule takes them."""
        if self.v_shape:
            return [pp_rank, self.num_stages - 1 - pp_rank]
        return [pp_rank + i * self.pp for i in range(self.stages_per_rank)]

    def ranks_stages(self) -> list[list[int]]:
        """Every pipeline rank's stages (for balancing a rank's total work)."""
        return [self.stage_ids(r) for r in range(self.pp)]

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank


def plan_from_entrypoint(
    entrypoint: Mapping[str, Any], *, dp: int, tp: int, pp: int
) -> ParallelPlan:
    """The plan a builtin entrypoint asks for (its plan fields; other keys are ignored).
    The API checks submissions with it and the ranks run it, so both see one plan."""
    chosen = {k: v for k, v in entrypoint.items() if k in _ENTRYPOINT_FIELDS}
    return ParallelPlan(dp=dp, tp=tp, pp=pp, **chosen)


def validate_plan(plan: ParallelPlan, model: GPTConfig, *, batch_size: int) -> None:
    """Raise PlanError for the first thing that cannot work. `batch_size` is per data-
    parallel rank and optimizer step (before gradient accumulation)."""
    for axis in ("dp", "tp", "pp", "microbatches"):
        if getattr(plan, axis) < 1:
            raise PlanError(_field(axis), "must be >= 1")
    _check_tensor_parallel(plan, model)
    _check_pipeline(plan, model, batch_size)
    if plan.grad_compression != "none" and (plan.fsdp or plan.tp > 1 or plan.pp > 1):
        raise PlanError(
            "entrypoint.grad_compression",
            "gradient compression is a DDP communication hook: it needs pure data parallel "
            "(tp = pp = 1, fsdp off)",
        )
    _check_updates(plan)


def _pure_data_parallel(plan: ParallelPlan) -> bool:
    return plan.tp == 1 and plan.pp == 1 and not plan.fsdp


def _check_updates(plan: ParallelPlan) -> None:
    if plan.sync_period < 1:
        raise PlanError("entrypoint.sync_period", "must be >= 1")
    if plan.update_mode != "sync" and not _pure_data_parallel(plan):
        raise PlanError(
            "entrypoint.update_mode",
            f"{plan.update_mode} combines whole replicas: it needs pure data parallel "
            "(tp = pp = 1, fsdp off)",
        )
    if plan.update_mode != "sync" and plan.grad_compression != "none":
        raise PlanError(
            "entrypoint.grad_compression",
            f"{plan.update_mode} sends parameters, not gradients: compression applies to sync",
        )
    if plan.max_staleness < 0:
        raise PlanError("entrypoint.max_staleness", "must be >= 0")
    if plan.balance_batch and plan.update_mode == "async":
        raise PlanError(
            "entrypoint.balance_batch", "async already lets each rank run at its own speed"
        )
    if plan.balance_batch and not _pure_data_parallel(plan):
        raise PlanError(
            "entrypoint.balance_batch", "batch rebalancing needs pure data parallel (DDP)"
        )
    if plan.balance_stages and plan.pp == 1:
        raise PlanError("entrypoint.balance_stages", "needs pipeline parallel (pp > 1)")


def _check_tensor_parallel(plan: ParallelPlan, model: GPTConfig) -> None:
    if plan.sequence_parallel and model.seq_len % plan.tp:
        raise PlanError(
            "entrypoint.sequence_parallel",
            f"tp={plan.tp} must divide the model's seq_len ({model.seq_len})",
        )
    for name, size in (("n_head", model.n_head), ("n_embd", model.n_embd)):
        if size % plan.tp:
            raise PlanError(
                "parallelism.tp", f"tp={plan.tp} must divide the model's {name} ({size})"
            )


def _check_pipeline(plan: ParallelPlan, model: GPTConfig, batch_size: int) -> None:
    if plan.num_stages > model.n_layer + 2:
        raise PlanError(
            "parallelism.pp",
            f"{plan.num_stages} pipeline stages for a model of {model.n_layer} layers: every "
            "stage needs a layer, but the first may hold only the embeddings and the last "
            "only the head",
        )
    if batch_size % plan.microbatches:
        raise PlanError(
            "entrypoint.microbatches",
            f"{plan.microbatches} microbatches must divide the batch size ({batch_size})",
        )
    if plan.pp > 1 and plan.pipeline_schedule == "1f1b" and plan.microbatches < plan.pp:
        raise PlanError(
            "entrypoint.microbatches",
            f"1F1B needs at least pp={plan.pp} microbatches (torch's Schedule1F1B); got "
            f"{plan.microbatches}",
        )
    looped = plan.stages_per_rank > 1 and not plan.v_shape  # ZB-V takes any count
    if looped and plan.microbatches % plan.pp:
        raise PlanError(
            "entrypoint.microbatches",
            f"interleaved 1F1B needs a multiple of pp={plan.pp} microbatches",
        )


_ENTRYPOINT_FIELDS = {f.name for f in fields(ParallelPlan)} - {"dp", "tp", "pp"}


def _field(axis: str) -> str:
    return f"entrypoint.{axis}" if axis == "microbatches" else f"parallelism.{axis}"
