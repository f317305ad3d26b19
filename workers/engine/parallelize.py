"""Turn a full model into this rank's part of a hybrid-parallel model, in a fixed order:

    pipeline split -> tensor parallel -> activation checkpointing -> FSDP2 | DDP

Every rank first builds the whole model from the same seed, so each shard is a slice of
identical weights and a run matches a single process with the same seed. Each `apply_*`
is torch.distributed's own part (`parallelize_module`, `fully_shard`, DDP comm hooks,
`torch.distributed.pipelining`); this module only decides what goes where.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from workers.engine.gpt import GPT, Block, splits_head
from workers.engine.model_configs import GPTConfig
from workers.engine.plan import ParallelPlan


@dataclass
class ModelParts:
    """This rank's share of the model: one part per pipeline stage it runs (one, or two
    with interleaved 1F1B or ZB-V), already parallelized; `schedule` is set when pp > 1."""

    parts: list[GPT]
    stage_ids: list[int]
    schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None
    ddp: DistributedDataParallel | None = None  # wraps parts[0] for pure data parallel
    # The head is split over stages: the first stage takes (tokens, targets) and every
    # stage passes the targets on (`GPT.keep_only`).
    carries_targets: bool = False

    @property
    def first(self) -> bool:
        return 0 in self.stage_ids

    def last(self, plan: ParallelPlan) -> bool:
        return plan.num_stages - 1 in self.stage_ids


def build_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    return init_device_mesh(
        device_type, (plan.pp, plan.dp, plan.tp), mesh_dim_names=("pp", "dp", "tp")
    )


def build_parts(
    plan: ParallelPlan,
    config: GPTConfig,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    seed: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    stage_units: Sequence[range] = (),
    ddp_hook: tuple[Any, Callable[..., Any]] | None = None,
) -> ModelParts:
    """`stage_units`: each pipeline stage's units, block pieces and head slices (pp > 1,
    `GPT.keep_only`).
    `ddp_hook`: DDP's comm hook (state, hook) when the caller chooses it; else the plan's
    compression hook."""
    pp_rank = mesh.get_local_rank("pp")
    stage_ids = plan.stage_ids(pp_rank)
    parts = []
    carries_targets = plan.pp > 1 and splits_head(config, list(stage_units))
    for stage in stage_ids:
        torch.manual_seed(seed)  # the same full model on every rank and in a single process
        model = GPT(config).to(device)
        if plan.pp > 1:
            units = stage_units[stage]
            model.keep_only(units, first=stage == 0)
        parts.append(model)
    for model in parts:
        if plan.tp > 1:
            apply_tensor_parallel(model, mesh["tp"], sequence_parallel=plan.sequence_parallel)
        if plan.activation_checkpointing:
            apply_activation_checkpointing(model)
        if plan.fsdp:
            apply_fsdp(model, mesh["dp"], plan)
    result = ModelParts(parts, stage_ids, carries_targets=carries_targets)
    # async: no DDP, the ranks exchange with a parameter server (workers.engine.async_ps)
    if (
        plan.dp > 1
        and not plan.fsdp
        and plan.tp == 1
        and plan.pp == 1
        and plan.update_mode != "async"
    ):
        result.ddp = apply_ddp(parts[0], mesh["dp"], plan, ddp_hook)
    if plan.pp > 1:
        result.schedule = build_schedule(
            plan, parts, stage_ids, mesh=mesh, device=device, loss_fn=loss_fn
        )
    return result


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Megatron-style: q, k, v and each MLP slice's fc column-wise (each rank computes
    n_head / tp heads and 1/tp of every slice's hidden columns), proj row-wise. The MLP's
    slices leave their row-wise products as partial sums, added together before the MLP
    returns, so it still costs one all-reduce each way (as the attention does). Embeddings, the
    final norm and the head stay replicated.

    Sequence parallel: between the row-wise and the next column-wise layer (the residual
    stream and the two LayerNorms) each rank keeps 1/tp of the sequence, so the
    all-reduce becomes a reduce-scatter + all-gather and those activations take 1/tp of
    the memory. A stage's blocks take and give the full sequence, so embeddings, the head
    and pipeline boundaries do not change."""
    # Outside the blocks' layers the activations are whole, or under sequence parallel
    # sharded by sequence.
    between = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.proj": RowwiseParallel(),
        "mlp.fc.*": ColwiseParallel(),
        "mlp.proj.*": RowwiseParallel(output_layouts=Partial(), use_local_output=False),
        # The MLP's input as one DTensor: its slices' input gradients add up as partial
        # sums too, so backward also costs one collective, not one per slice.
        "mlp": PrepareModuleInputOutput(
            input_layouts=(between,),
            desired_input_layouts=(Replicate(),),
            output_layouts=(Partial(),),
            desired_output_layouts=(between,),
        ),
    }
    if sequence_parallel:
        to_full = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
        plan |= {
            "ln1": SequenceParallel(),
            "attn": to_full,
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(),
        }
    blocks = list(model.blocks.values())
    for block in blocks:
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        parallelize_module(
            blocks[0],
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Replicate(),),
                desired_input_layouts=(Shard(1),),
                use_local_output=True,
            ),
        )
        parallelize_module(
            blocks[-1],
            tp_mesh,
            PrepareModuleOutput(
                output_layouts=(Shard(1),),
                desired_output_layouts=(Replicate(),),
                use_local_output=True,
            ),
        )


def apply_activation_checkpointing(model: GPT) -> None:
    """Recompute each block's activations in backward: memory for compute."""
    for block in model.blocks.values():
        assert isinstance(block, Block)
        block.recompute = True


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, plan: ParallelPlan) -> None:
    """FSDP2 per block, then the rest: each block's parameters are gathered just before
    it runs and freed after. bf16 keeps fp32 master weights and reduces in fp32.

    Under ZB-V the stage is one FSDP unit. Measured: with a unit per block, gpt-tiny dp=2
    pp=2 left the single process by 0.03 in 4 steps; with one unit per stage, 4.8e-7.
    The cause is not traced: torch's stage runs every unit's post-backward by hand after
    the last weight pass, so the likely culprit is the per-block units' own autograd
    hooks firing in ZB-V's input-gradient pass, before their weight gradients exist.
    Parameters, gradients and optimizer state stay sharded at rest; a stage's parameters
    are gathered together rather than block by block."""
    policy = MixedPrecisionPolicy()
    if plan.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if not plan.v_shape:
        for block in model.blocks.values():
            fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def apply_ddp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    plan: ParallelPlan,
    hook: tuple[Any, Callable[..., Any]] | None = None,
) -> DistributedDataParallel:
    device_ids = [model_device(model)] if model_device(model).type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=dp_mesh.get_group())
    hook = hook or plan_comm_hook(plan, dp_mesh.get_group())
    if hook is not None:
        state, fn = hook
        ddp.register_comm_hook(state, fn)
    return ddp


def plan_comm_hook(
    plan: ParallelPlan, group: dist.ProcessGroup
) -> tuple[Any, Callable[..., Any]] | None:
    """fp16 and PowerSGD are torch's hooks. The stock bf16 hook refuses anything but NCCL,
    so bf16 uses the same compress-allreduce-decompress helper the stock hooks are built
    on, which works on gloo too."""
    if plan.grad_compression == "fp16":
        return group, default_hooks.fp16_compress_hook
    if plan.grad_compression == "bf16":
        return group, _bf16_compress_hook
    if plan.grad_compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        return state, powerSGD_hook.powerSGD_hook
    return None


def _bf16_compress_hook(process_group: Any, bucket: Any) -> Any:
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


# DDP checks the hook's annotations against the classes themselves; postponed annotations
# (`from __future__ import annotations`) are strings, so give it the objects.
_bf16_compress_hook.__annotations__.update(
    bucket=dist.GradBucket,  # type: ignore[attr-defined]
    **{"return": torch.futures.Future[torch.Tensor]},
)


def build_schedule(
    plan: ParallelPlan,
    parts: Sequence[nn.Module],
    stage_ids: list[int],
    *,
    mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    group = mesh.get_group("pp")
    stages: list[Any] = [
        PipelineStage(part, stage, plan.num_stages, device, group=group)
        for part, stage in zip(parts, stage_ids, strict=True)
    ]
    if plan.pipeline_schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, plan.microbatches, loss_fn=loss_fn)
    if plan.pipeline_schedule == "zbv":
        return ScheduleZBVZeroBubble(stages, plan.microbatches, loss_fn=loss_fn)
    kind = ScheduleGPipe if plan.pipeline_schedule == "gpipe" else Schedule1F1B
    return kind(stages[0], plan.microbatches, loss_fn=loss_fn)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
