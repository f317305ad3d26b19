"""Export of a sharded checkpoint (dp=2 x tp=2) to one safetensors file and an int8 copy:
the same logits as torch's own consolidation of the checkpoint, the validation loss the
run itself measured, and an int8 file (torchao's layout) at least 2.5x smaller, whose
weights are the float ones within half a quantization step and which loads back into a
quantized model giving the validation loss the export measured."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from bench.harness.engine import run_engine
from workers.engine.data import SyntheticTokens
from workers.engine.evaluation import evaluate
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
    # the quantized model's own (dynamic int8 activations), on the same samples
    assert int8["val_loss"] == pytest.approx(full["val_loss"], rel=0.02)
    assert ctx.progress().metrics["bytes_int8"] == int8["bytes"]

    floats, stored = load_file(outputs / FULL), load_file(outputs / INT8)
    dequantized = load_int8(outputs / INT8)
    assert dequantized.keys() == floats.keys()
    # every linear layer's and embedding's weight is int8; norms and biases as they were
    quantized = {
        name
        for name, module in GPT(MODEL_CONFIGS["gpt-tiny"]).named_modules()
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding)
    }
    assert {name for name in stored if name.endswith("._weight_qdata")} == {
        f"{name}._weight_qdata" for name in quantized
    }
    for name, weight in floats.items():
        module = name.removesuffix(".weight")
        if module in quantized:
            # a row's largest positive weight is 127.5 steps, clamped to 127: exactly half
            # a step off, and float32 rounding may add a little to that
            step = stored[f"{module}._weight_scale"]
            assert ((dequantized[name] - weight).abs() <= step * (0.5 + 1e-3)).all(), name
        else:
            assert torch.equal(dequantized[name], weight), name

    # as the module's docstring says: torchao reads it back into a quantized model
    from torchao.prototype.safetensors.safetensors_support import (  # type: ignore[import-untyped]
        unflatten_tensor_state_dict,
    )

    with safe_open(outputs / INT8, "pt") as file:
        metadata = file.metadata()
    assert {key: metadata[key] for key in ("model", "weights", "by")} == {
        "model": "gpt-tiny",
        "weights": "int8",
        "by": "gangway",
    }
    state, rest = unflatten_tensor_state_dict(stored, metadata)
    assert not rest
    config = MODEL_CONFIGS["gpt-tiny"]
    served = GPT(config)
    served.load_state_dict(state, assign=True)  # strict: every weight, no more
    held_out = SyntheticTokens(
        vocab_size=config.vocab_size, seq_len=config.seq_len, seed=0, validation=True
    )
    again = evaluate(served, held_out, batch_size=2 * 4, batches=4)
    assert again["val_loss"] == pytest.approx(int8["val_loss"], abs=1e-6)


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
