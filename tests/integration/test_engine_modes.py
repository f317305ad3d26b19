"""Update modes, batch rebalancing and balanced pipeline stages on gloo ranks.

Parity is expected where the mathematics gives it: local SGD with period 1 under plain
SGD (averaging parameters after one linear step equals stepping with the averaged
gradient; AdamW is not linear in the gradient, so it is not expected there), and any
split of the same global batch or of the pipeline's layers.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from bench.harness.engine import run_engine
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec

TOLERANCE = 1e-5
PARAM_BYTES = 236_928 * 4  # gpt-tiny's parameters, fp32


@cache
def sgd_sync_losses(out: Path) -> tuple[float, ...]:
    spec = TrainSpec(steps=6, batch_size=4, optimizer="sgd", learning_rate=0.1, max_grad_norm=None)
    return tuple(run_engine(ParallelPlan(dp=2), spec, out / "sgd-sync")["losses"])


def test_local_sgd_with_period_1_equals_sync(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.getbasetemp()
    spec = TrainSpec(steps=6, batch_size=4, optimizer="sgd", learning_rate=0.1, max_grad_norm=None)
    plan = ParallelPlan(dp=2, update_mode="local-sgd", sync_period=1)
    losses = run_engine(plan, spec, out / "local-1")["losses"]
    assert losses == pytest.approx(sgd_sync_losses(out), abs=TOLERANCE)


def test_local_sgd_sends_parameters_every_period_and_nothing_between(tmp_path: Path) -> None:
    spec = TrainSpec(steps=8, batch_size=4)
    sync = run_engine(ParallelPlan(dp=2), spec, tmp_path / "sync")["history"]
    local = run_engine(ParallelPlan(dp=2, update_mode="local-sgd", sync_period=4), spec, tmp_path)
    assert [h["comm_bytes"] for h in sync] == [PARAM_BYTES] * 8  # every gradient, every step
    assert [h["comm_bytes"] for h in local["history"]] == [0, 0, 0, PARAM_BYTES] * 2
    assert all(h["comm_s"] > 0 for h in sync)
    assert local["losses"][-1] < local["losses"][0] - 0.3


@pytest.mark.parametrize("mode", ["local-sgd", "diloco", "adaptive"])
def test_a_periodic_mode_resumes_from_a_stop_between_syncs(mode: str, tmp_path: Path) -> None:
    """Stopped at step 3 of period 4 (as by a preemption notice): the checkpoint holds the
    averaged replicas, the job resumes there and ends near the uninterrupted run."""
    plan = ParallelPlan(dp=2, update_mode=mode, sync_period=4)  # type: ignore[arg-type]
    spec = TrainSpec(steps=10, batch_size=4)
    checkpoints = tmp_path / "checkpoints"
    first = run_engine(plan, spec, tmp_path / "a", checkpoint_dir=checkpoints, stop_at=3)
    assert first["step"] == 3
    second = run_engine(plan, spec, tmp_path / "b", checkpoint_dir=checkpoints)
    assert (second["resumed_from"], second["step"]) == (3, 10)
    whole = run_engine(plan, spec, tmp_path / "whole")["losses"]
    assert second["losses"][-1] == pytest.approx(whole[-1], rel=0.03)
    assert second["losses"][-1] < first["losses"][0] - 0.3


def test_a_periodic_mode_resumes_at_another_data_parallel_degree(tmp_path: Path) -> None:
    """Elastic resize: a local-SGD checkpoint from dp=2 loads at dp=4."""
    checkpoints = tmp_path / "checkpoints"
    spec = TrainSpec(steps=6, batch_size=2)
    run_engine(
        ParallelPlan(dp=2, update_mode="local-sgd", sync_period=2),
        spec,
        tmp_path / "dp2",
        checkpoint_dir=checkpoints,
        stop_at=3,
    )
    resumed = run_engine(
        ParallelPlan(dp=4, update_mode="local-sgd", sync_period=2),
        spec,
        tmp_path / "dp4",
        checkpoint_dir=checkpoints,
    )
    assert (resumed["resumed_from"], resumed["step"]) == (3, 6)


def test_slower_rank_gets_a_smaller_share_and_the_loss_is_unchanged(tmp_path: Path) -> None:
    spec = TrainSpec(steps=14, batch_size=4, max_grad_norm=None)
    equal = run_engine(ParallelPlan(dp=2), spec, tmp_path / "equal")
    balanced = run_engine(
        ParallelPlan(dp=2, balance_batch=True), spec, tmp_path / "balanced", slowdown={1: 3.0}
    )
    shares = [h["batch_share"] for h in balanced["history"]]
    assert shares[:10] == [4] * 10  # rank 0, fast: equal until the first window is measured
    assert all(share >= 5 for share in shares[10:]), shares
    assert balanced["events"][0].startswith("step 10: batch shares [4, 4] -> [")
    assert balanced["losses"] == pytest.approx(equal["losses"], abs=TOLERANCE)


def test_balanced_pipeline_stages_keep_the_single_process_loss(tmp_path: Path) -> None:
    """Stages cut inside blocks and inside the head (forced item times) under 1F1B, then
    ZB-V with FSDP over dp = 2 (two stages per rank in a V, balanced by rank), stopped and
    resumed from its checkpoint under 1F1B's different split at dp = 1: every run follows
    one process. The splits send the packed boundaries: residual + the MLP's normed input
    inside a block, normed hidden state + running log-sum-exp inside the head (with the target
    ids travelling from the first stage)."""
    spec = TrainSpec(steps=4, batch_size=8)
    single = run_engine(ParallelPlan(), spec, tmp_path / "one")["losses"]
    # gpt-tiny: embeddings, 4 blocks x (attention, 4 MLP slices), the head's 4 slices.
    # Even at 11 + 11: stage 0 = embeddings + layer 0 + layer 1's attention, MLP slices 0-2.
    times = [2.0, *[1.0] * 20, *[0.0] * 4]
    plan = ParallelPlan(pp=2, microbatches=2, balance_stages=True)
    balanced = run_engine(plan, spec, tmp_path / "pp2", item_times=times)
    assert balanced["losses"] == pytest.approx(single, abs=TOLERANCE)
    [split] = balanced["events"]  # the split goes to the job's events
    assert split.startswith(
        "pipeline stages by measured cost: 0: embeddings + layer 0 + layer 1 (attention, MLP "
        "slices 0-2 of 4), 11000.0 ms, 0 MiB; 1: layer 1 (MLP slice 3 of 4) + layers 2-3 + "
        "head, 11000.0 ms"
    )
    zbv = ParallelPlan(
        dp=2, pp=2, fsdp=True, microbatches=2, pipeline_schedule="zbv", balance_stages=True
    )
    # Ranks 27.5 + 27.5: every boundary packed (two inside layer 3's MLP, one in the head).
    v_times = [3.0, 2, 1.5, 1.5, 1.5, 1.5, 2, 1, 1, 1.5, 1.5, 1, 0.5, 0.5, 1.5, 1.5]
    v_times += [1, 1.5, 1.5, 1, 1, 12, 1, 11, 2]
    checkpoints = tmp_path / "checkpoints"
    first = run_engine(
        zbv,
        TrainSpec(steps=4, batch_size=4),  # per dp rank: the same global batch of 8
        tmp_path / "zbv",
        checkpoint_dir=checkpoints,
        stop_at=2,
        item_times=v_times,
    )
    assert first["step"] == 2
    events = first["events"][0]
    assert "0: embeddings + layers 0-2 + layer 3 (attention, MLP slice 0 of 4)" in events
    assert "1: layer 3 (MLP slice 1 of 4)" in events
    assert "2: layer 3 (MLP slices 2-3 of 4) + head slices 0-2 of 4" in events
    assert "3: head slice 3 of 4" in events
    # 1F1B with the head split the other way: stage 0 = everything up to its first slice.
    head_times = [0.0, *[0.1] * 20, *[1.0] * 4]
    second = run_engine(
        plan, spec, tmp_path / "resumed", checkpoint_dir=checkpoints, item_times=head_times
    )
    assert "0: embeddings + layers 0-3 + head slice 0 of 4" in second["events"][0]
    assert second["resumed_from"] == 2
    assert first["losses"] + second["losses"] == pytest.approx(single, abs=TOLERANCE)


def test_async_applies_no_update_older_than_the_bound(tmp_path: Path) -> None:
    """Rank 1 three times slower: rank 0 never waits for it, and every update the server
    applied was computed on parameters at most S versions old (older ones dropped)."""
    plan = ParallelPlan(dp=2, update_mode="async", max_staleness=1)
    spec = TrainSpec(steps=30, batch_size=4)
    result = run_engine(plan, spec, tmp_path, slowdown={1: 3.0})
    history = result["history"]
    assert result["step"] == 30
    assert all(h["max_staleness"] <= 1 for h in history)
    assert sum(h["updates_dropped"] for h in history) > 0  # the bound was needed
    losses = result["losses"]  # one rank's batch each: compare means of five
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3


def test_async_resumes_from_the_master_parameters(tmp_path: Path) -> None:
    """Stopped mid-run (a preemption notice), with interval checkpoints between: the run
    resumes from the master parameters (not from scratch) and finishes. Async order
    depends on timing, so the losses are compared with the start, not an unbroken run."""
    plan = ParallelPlan(dp=2, update_mode="async", max_staleness=2)
    spec = TrainSpec(steps=24, batch_size=4, checkpoint_interval_steps=5)
    checkpoints = tmp_path / "checkpoints"
    first = run_engine(plan, spec, tmp_path / "a", checkpoint_dir=checkpoints, stop_at=8)
    assert 8 <= first["step"] < 24
    second = run_engine(plan, spec, tmp_path / "b", checkpoint_dir=checkpoints)
    assert (second["resumed_from"], second["step"]) == (first["step"], 24)
    start = sum(first["losses"][:3]) / 3
    assert sum(second["losses"][:3]) / 3 < start - 0.3  # trained parameters came back
    assert sum(second["losses"][-3:]) / 3 < start - 0.3
