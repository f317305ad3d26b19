"""The hybrid-parallel engine on local gloo processes: loss parity with one process,
resharding checkpoints, compressed gradients. gpt-tiny has 2 heads and 4 layers.

Parity: every run starts from the same seed and reads the same samples per step (the data
stream is indexed by sample, whatever dp is), so each parallel run must follow the
single-process loss curve, in fp32, to 1e-5 (measured: within 1e-6). The validation pass
at the end of each run (`workers.engine.evaluation`) reads the same held-out samples at
any plan, so its figures match one process's too.
"""

from __future__ import annotations

import math
import threading
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from bench.harness.engine import run_engine
from workers.engine.data import VALIDATION_OFFSET, SyntheticTokens, TokenFile, rank_slice
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.plan import ParallelPlan, PlanError, validate_plan
from workers.engine.training import TrainSpec
from workers.launch import RankInfo
from workers.program.context import RankContext

STEPS = 5
TOLERANCE = 1e-5


# Compared to 1e-5 (val_perplexity, exp(val_loss), is 164 x as far apart: not compared)
VALIDATION = ("val_loss", "val_token_accuracy")


@cache
def single_process_run(batch_size: int, out: Path) -> dict[str, Any]:
    spec = TrainSpec(steps=STEPS, batch_size=batch_size)
    return run_engine(ParallelPlan(), spec, out / f"single-{batch_size}")


def single_process_losses(batch_size: int, out: Path) -> tuple[float, ...]:
    return tuple(single_process_run(batch_size, out)["losses"])


def validation(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in VALIDATION if name in metrics}


@pytest.mark.parametrize(
    ("plan", "batch_size"),
    [
        (ParallelPlan(dp=2), 4),  # DDP
        (ParallelPlan(dp=2, fsdp=True), 4),
        (ParallelPlan(tp=2), 8),
        (ParallelPlan(pp=2, microbatches=2, pipeline_schedule="gpipe"), 8),
        (ParallelPlan(pp=2, microbatches=2, pipeline_schedule="1f1b"), 8),
        (ParallelPlan(pp=2, microbatches=2, pipeline_schedule="interleaved-1f1b"), 8),
        (ParallelPlan(dp=2, tp=2), 4),  # data parallel synced by hand beside TP
        (ParallelPlan(dp=2, pp=2, microbatches=2, pipeline_schedule="zbv"), 4),
        (ParallelPlan(dp=2, pp=2, fsdp=True, microbatches=2, pipeline_schedule="zbv"), 4),
        (ParallelPlan(pp=5, microbatches=5), 10),  # 4 layers: the last stage is the head
        (ParallelPlan(tp=2, pp=2, microbatches=2, sequence_parallel=True), 8),
        (ParallelPlan(dp=2, tp=2, pp=2, fsdp=True, microbatches=2), 4),  # 8 ranks
    ],
    ids=[
        "ddp2",
        "fsdp2",
        "tp2",
        "pp2-gpipe",
        "pp2-1f1b",
        "pp2-interleaved",
        "dp2xtp2",
        "dp2xpp2-zbv",
        "dp2xpp2-zbv-fsdp",
        "pp5-head-only-stage",
        "tp2xpp2-sequence-parallel",
        "2x2x2",
    ],
)
def test_loss_matches_a_single_process(
    plan: ParallelPlan, batch_size: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.getbasetemp()
    single = single_process_run(batch_size * plan.dp, out)
    spec = TrainSpec(steps=STEPS, batch_size=batch_size)
    result = run_engine(plan, spec, out / f"run-{plan.dp}-{plan.tp}-{plan.pp}")
    losses = result["losses"]
    assert losses == pytest.approx(single["losses"], abs=TOLERANCE)
    assert losses[-1] < losses[0] - 0.2  # and it learns
    # ZB-V runs no validation pass (torch's has no forward-only path)
    evaluated = plan.pp == 1 or plan.pipeline_schedule != "zbv"
    expected = validation(single["metrics"]) if evaluated else {}
    assert validation(result["metrics"]) == pytest.approx(expected, abs=TOLERANCE)


def test_validation_passes_leave_the_training_curve_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A pipeline switches to its forward-only pass and back every `eval_every` steps."""
    out = tmp_path_factory.getbasetemp()
    plan = ParallelPlan(pp=2, microbatches=2, pipeline_schedule="1f1b")
    spec = TrainSpec(steps=STEPS, batch_size=8, eval_every=2)
    result = run_engine(plan, spec, out / "evaluated-every-2")
    single = single_process_run(8, out)
    assert result["losses"] == pytest.approx(single["losses"], abs=TOLERANCE)
    evaluated = [step for step, point in enumerate(result["history"], 1) if validation(point)]
    assert evaluated == [2, 4, 5]
    last = result["history"][-1]
    assert validation(last) == pytest.approx(validation(single["metrics"]), abs=TOLERANCE)
    assert last["val_perplexity"] == pytest.approx(math.exp(last["val_loss"]))


def test_gradient_accumulation_equals_the_larger_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.getbasetemp()
    spec = TrainSpec(steps=STEPS, batch_size=2, grad_accumulation=2)
    result = run_engine(ParallelPlan(dp=2), spec, out / "accumulate")
    assert result["losses"] == pytest.approx(single_process_losses(8, out), abs=TOLERANCE)
    metrics = result["metrics"]  # the straggler signal: both forwards, within the step
    assert 0 < metrics["local_s"] < metrics["step_time_s"]


def test_checkpoint_at_dp4_resumes_at_dp2_on_the_same_curve(tmp_path: Path) -> None:
    """FSDP at dp=4 is stopped after 3 of 6 steps (as by a preemption notice) and
    checkpoints; the job resumes at dp=2 with the same global batch and continues the
    uninterrupted single-process curve."""
    checkpoints = tmp_path / "checkpoints"
    first = run_engine(
        ParallelPlan(dp=4, fsdp=True),
        TrainSpec(steps=6, batch_size=2),
        tmp_path / "dp4",
        checkpoint_dir=checkpoints,
        stop_at=3,
    )
    assert (first["step"], len(first["losses"])) == (3, 3)
    second = run_engine(
        ParallelPlan(dp=2, fsdp=True),
        TrainSpec(steps=6, batch_size=4),
        tmp_path / "dp2",
        checkpoint_dir=checkpoints,
    )
    assert (second["resumed_from"], second["step"]) == (3, 6)
    whole = run_engine(ParallelPlan(), TrainSpec(steps=6, batch_size=8), tmp_path / "one")
    assert first["losses"] + second["losses"] == pytest.approx(whole["losses"], abs=TOLERANCE)
    kept = sorted(p.name for p in checkpoints.iterdir())
    assert kept == ["step-00000003", "step-00000006"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # read back in-process
def test_a_resize_keeps_the_batch_per_rank_and_the_data_position(tmp_path: Path) -> None:
    """An elastic resize keeps each rank's batch, so the global batch follows dp; the
    checkpoint carries the data position, and the job reads on from there."""
    checkpoints = tmp_path / "checkpoints"
    spec = TrainSpec(steps=5, batch_size=2)
    run_engine(ParallelPlan(dp=2), spec, tmp_path / "dp2", checkpoint_dir=checkpoints, stop_at=3)
    assert _saved_position(checkpoints / "step-00000003") == 3 * 4
    resumed = run_engine(ParallelPlan(dp=4), spec, tmp_path / "dp4", checkpoint_dir=checkpoints)
    assert (resumed["resumed_from"], resumed["step"]) == (3, 5)
    assert _saved_position(checkpoints / "step-00000005") == 3 * 4 + 2 * 8


def _saved_position(checkpoint: Path) -> int:
    state = {"trainer": {"next_sample": torch.tensor(0)}}
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    return int(state["trainer"]["next_sample"].item())


def test_the_data_stream_neither_repeats_nor_skips_across_a_change_of_dp() -> None:
    global_batch = 8
    read: list[int] = []
    for step, dp in [(1, 4), (2, 4), (3, 4), (4, 2), (5, 2), (6, 1)]:
        for rank in range(dp):
            first, count = rank_slice((step - 1) * global_batch, global_batch, rank, dp)
            read.extend(range(first, first + count))
    assert read == list(range(6 * global_batch))


@cache
def uncompressed_losses(out: Path) -> tuple[float, ...]:
    spec = TrainSpec(steps=30, batch_size=4, max_grad_norm=None)
    return tuple(run_engine(ParallelPlan(dp=2), spec, out / "uncompressed")["losses"])


@pytest.mark.parametrize(
    ("compression", "margin"),
    [("fp16", 0.01), ("bf16", 0.01), ("powersgd", 1.2)],  # rank-1 PowerSGD lags, as it does
)
def test_compressed_gradients_converge(
    compression: Any, margin: float, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.getbasetemp()
    plan = ParallelPlan(dp=2, grad_compression=compression)
    spec = TrainSpec(steps=30, batch_size=4, max_grad_norm=None)
    losses = run_engine(plan, spec, out / compression)["losses"]
    baseline = uncompressed_losses(out)
    assert losses[-1] < losses[0] - 0.8, losses
    assert losses[-1] < baseline[-1] + margin, (losses[-1], baseline[-1])


def test_bf16_autocast_and_activation_checkpointing_train(tmp_path: Path) -> None:
    plan = ParallelPlan(precision="bf16", activation_checkpointing=True)
    result = run_engine(plan, TrainSpec(steps=30, batch_size=8), tmp_path)
    losses = result["losses"]
    assert losses[-1] < losses[0] - 1.5, losses
    # the validation pass at the end has its fp32 shadow: bf16 drifts, but not far
    metrics = result["metrics"]
    assert metrics["val_loss_fp32"] != metrics["val_loss"]
    assert 0 < metrics["precision_drift"] < 0.05, metrics


@pytest.mark.parametrize(
    ("plan", "batch_size", "field"),
    [
        (ParallelPlan(tp=4), 8, "parallelism.tp"),  # 2 heads
        (ParallelPlan(tp=3), 8, "parallelism.tp"),
        (ParallelPlan(pp=7), 8, "parallelism.pp"),  # 4 layers + embeddings + head
        (ParallelPlan(pp=4, pipeline_schedule="interleaved-1f1b"), 8, "parallelism.pp"),
        (ParallelPlan(pp=4, pipeline_schedule="zbv"), 8, "parallelism.pp"),
        (ParallelPlan(pp=2, microbatches=3), 8, "entrypoint.microbatches"),
        (ParallelPlan(pp=2), 8, "entrypoint.microbatches"),  # 1F1B: one per stage at least
        (
            ParallelPlan(pp=2, microbatches=3, pipeline_schedule="interleaved-1f1b"),
            6,
            "entrypoint.microbatches",
        ),
        (ParallelPlan(dp=2, fsdp=True, grad_compression="fp16"), 8, "entrypoint.grad_compression"),
        (ParallelPlan(dp=0), 8, "parallelism.dp"),
        (ParallelPlan(tp=3, sequence_parallel=True), 8, "entrypoint.sequence_parallel"),
    ],
)
def test_invalid_plans_fail_before_anything_starts(
    plan: ParallelPlan, batch_size: int, field: str
) -> None:
    with pytest.raises(PlanError) as caught:
        validate_plan(plan, MODEL_CONFIGS["gpt-tiny"], batch_size=batch_size)
    assert caught.value.field == field


def test_a_token_file_is_read_as_consecutive_windows(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    inputs, targets = TokenFile(path, seq_len=8).samples(2, 2)
    assert inputs.tolist() == [list(range(16, 24)), list(range(24, 32))]
    assert targets.tolist() == [list(range(17, 25)), list(range(25, 33))]
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TokenFile(path, seq_len=100)


def test_a_token_file_holds_out_its_last_windows_for_validation(tmp_path: Path) -> None:
    """12 windows of 8 tokens (+1): training wraps around the first 11, validation reads
    the 12th."""
    path = tmp_path / "train.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    training, _ = TokenFile(path, seq_len=8).samples(10, 2)
    assert [row[0] for row in training.tolist()] == [80, 0]
    held_out, targets = TokenFile(path, seq_len=8, validation=True).samples(0, 2)
    assert held_out.tolist() == [list(range(88, 96))] * 2
    assert targets.tolist() == [list(range(89, 97))] * 2


def test_synthetic_validation_samples_are_not_training_samples() -> None:
    kwargs: dict[str, Any] = {"vocab_size": 256, "seq_len": 64, "seed": 0}  # noisy enough
    train_rows = SyntheticTokens(**kwargs).samples(0, 64)[0].tolist()
    held_out = SyntheticTokens(**kwargs, validation=True).samples(0, 64)[0].tolist()
    assert not {tuple(row) for row in train_rows} & {tuple(row) for row in held_out}
    assert held_out == SyntheticTokens(**kwargs).samples(VALIDATION_OFFSET, 64)[0].tolist()


def test_function_entrypoints_checkpoint_through_the_context(tmp_path: Path) -> None:
    """`ctx.checkpointer` outside any process group: save twice, keep the newest, and a
    fresh model and optimizer resume from it."""
    ctx = RankContext(
        RankInfo(rank=0, world_size=1, local_rank=0, dp=1, tp=1, pp=1),
        threading.Event(),
        checkpoint_dir=tmp_path,
        keep_last=1,
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    saver = ctx.checkpointer([model], [optimizer])
    saver.save(3)
    saver.save(5)
    fresh = nn.Linear(4, 2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    assert ctx.checkpointer([fresh], [fresh_optimizer]).load_latest() == 5
    assert torch.equal(fresh.weight, model.weight)
    restored = fresh_optimizer.state[fresh.weight]["exp_avg"]
    assert torch.equal(restored, optimizer.state[model.weight]["exp_avg"])
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000005"]
