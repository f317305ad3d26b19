"""The service-side glue of predictions: job specs -> step-time model inputs, node types,
and when a prediction is worth writing again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.model import Node
from scheduler.runtime.prediction_writes import moved
from scheduler.runtime.trainer_shapes import common_node_type, node_type, trainer_job
from scheduler.store.predictions import JobPrediction
from scheduler.store.specs import spec_from_json

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_builtin_spec_becomes_the_model_and_plan_it_trains() -> None:
    spec = spec_from_json(
        {
            "parallelism": {"dp": {"min": 1, "max": 4}, "tp": 2, "fsdp": False},
            "entrypoint": {
                "kind": "builtin",
                "model": "gpt-mini",
                "steps": 300,
                "batch_size": 4,
                "grad_accumulation": 2,
                "precision": "bf16",
            },
        }
    )
    job = trainer_job(spec, dp=2)
    assert job is not None
    assert (job.model.n_layer, job.model.n_embd, job.steps) == (6, 384, 300)
    assert (job.plan.dp, job.plan.tp, job.plan.pp) == (2, 2, 1)
    assert (job.plan.batch_size, job.plan.grad_accumulation, job.plan.precision) == (4, 2, "bf16")
    largest = trainer_job(spec)
    assert largest is not None and largest.plan.dp == 4


def test_opaque_jobs_have_no_trainer_plan() -> None:
    spec = spec_from_json({"entrypoint": {"kind": "script", "path": "train.py"}})
    assert trainer_job(spec) is None


def test_nodes_of_one_shape_are_one_type_and_the_common_one_wins() -> None:
    gpu = [Node(f"g{i}", f"g{i}", 8, 64.0) for i in range(3)]
    cpu = Node("c", "c", 0, 16.0)
    assert node_type(gpu[0]).name == "8 GPU / 64 CPU"
    assert (node_type(cpu).devices_per_node, node_type(cpu).parallel_ranks) == (16, 16)
    assert common_node_type([*gpu, cpu]) == node_type(gpu[0])
    assert common_node_type([Node("d", "d", 8, 8.0, alive=False)]) is None


def prediction(
    runtime_s: float | None, end_s: float | None, source: str = "history"
) -> JobPrediction:
    end = NOW + timedelta(seconds=end_s) if end_s is not None else None
    return JobPrediction(runtime_s, runtime_s, None, None, source, "", estimated_end_at=end)


def test_a_prediction_is_rewritten_only_when_it_moved() -> None:
    old = prediction(3600.0, 3600.0)
    assert not moved(old, prediction(3610.0, 3650.0))  # within 2% of an hour
    assert moved(old, prediction(3800.0, 3600.0))
    assert moved(old, prediction(3600.0, 3800.0))
    assert moved(old, prediction(3600.0, 3600.0, source="steps"))
    assert moved(old, prediction(None, None, source="history"))
    assert moved(None, old)
    assert not moved(prediction(10.0, 10.0), prediction(20.0, 35.0))  # 30 s at least
