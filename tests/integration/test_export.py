"""Export of a sharded checkpoint (dp=2 x tp=2) to one safetensors file and an int8 copy:
the same logits as torch's own consolidation of the checkpoint, the validation loss the
run itself measured, and an int8 file at least 2.5x smaller."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from bench.harness.engine import run_engine
from workers.engine.gpt import GPT
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec
from workers.launch import RankInfo
from workers.program.context import RankContext
from workers.program.export import FULL, INT8, consolidated, export_model, load_int8

STEPS = 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """A gpt-tiny run at dp=2 x tp=2 with its final checkpoint, and what rank 0 reported."""
    root = tmp_path_factory.mktemp("trained")
    spec = TrainSpec(model="gpt-tiny", steps=STEPS, batch_size=4)
    result = run_engine(ParallelPlan(dp=2, tp=2), spec, root / "out", checkpoint_dir=root / "ck")
    return root / "ck" / f"step-{STEPS:08d}", result


def reference_model(checkpoint: Path, scratch: Path) -> GPT:
    """The checkpoint consolidated by torch's own tool, read without unpickling code."""
    dcp_to_torch_save(checkpoint, scratch / "ref.pt")
    state = torch.load(scratch / "ref.pt", weights_only=True)
    net = GPT(MODEL_CONFIGS["gpt-tiny"])
    net.load_state_dict({k.removeprefix("model."): v for k, v in state["model"].items()})
    return net.eval()


def test_export_gives_the_same_logits_and_an_int8_copy(
    trained: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    checkpoint, run = trained
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    info = RankInfo(rank=0, world_size=1, local_rank=0, dp=1, tp=1, pp=1)
    ctx = RankContext(info, threading.Event(), outputs_dir=outputs, model_dir=checkpoint)
    export_model(ctx, model="gpt-tiny", eval_batch=2 * 4, eval_batches=4, quantize="int8")

    exported = GPT(MODEL_CONFIGS["gpt-tiny"])
    exported.load_state_dict(load_file(outputs / FULL))  # strict: every weight, no more
    tokens = torch.randint(0, MODEL_CONFIGS["gpt-tiny"].vocab_size, (2, 16))
    with torch.no_grad():
        expected = reference_model(checkpoint, tmp_path)(tokens)
        assert torch.allclose(exported.eval()(tokens), expected, atol=1e-5)

    summary = json.loads((outputs / "export.json").read_text())
    full, int8 = summary["files"][FULL], summary["files"][INT8]
    assert full["bytes"] >= 2.5 * int8["bytes"]
    # the loss of the run's own validation pass at its last step, on the same samples
    assert full["val_loss"] == pytest.approx(run["metrics"]["val_loss"], abs=1e-5)
    assert int8["val_loss"] == pytest.approx(full["val_loss"], rel=0.02)
    quantized = GPT(MODEL_CONFIGS["gpt-tiny"])
    quantized.load_state_dict(load_int8(outputs / INT8))
    assert ctx.progress().metrics["bytes_int8"] == int8["bytes"]


class _Payload:
    """What a hostile rank program could pickle into a checkpoint's `.metadata`."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/gangway-owned",))


def test_a_checkpoint_whose_metadata_runs_code_is_refused(
    trained: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    """A version shared with a reader is loaded in the reader's job: its metadata (a
    pickle) may name DCP's classes only, and its model entries must be tensors."""
    forged = tmp_path / "forged"
    shutil.copytree(trained[0], forged)
    (forged / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(pickle.UnpicklingError, match=r"may not name (posix|os)\.system"):
        consolidated("gpt-tiny", forged)
    assert not Path("/tmp/gangway-owned").exists()
