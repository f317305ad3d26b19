"""Export a registered model version for deployment: one consolidated safetensors file
from a sharded checkpoint, whatever dp/tp/pp it was trained with, and optionally an int8
copy; each with its validation loss on the held-out split it was trained against.

Runs as a one-rank job on the cluster (`POST /v1/models/{name}/versions/{ref}/export`
submits it, started from the version with `init_from`): loading a model needs memory the
API process should not spend. The files go to the job's OUTPUTS_DIR, so its owner
downloads them as any job's outputs (`gangway download JOB`); `export.json` beside them
says what each holds.

No code in the checkpoint runs: DCP reads it into a freshly built model through
`Checkpointer.load_weights` (its metadata through an unpickler that admits DCP's classes
only, model entries only as tensors); the files written are safetensors (tensors and
string metadata only).

int8: quantized with torchao, PyTorch's quantization library (torch.ao.quantization is
deprecated, pytorch#184982): the linear layers with `Int8DynamicActivationInt8WeightConfig`
(int8 weights per output row, activations quantized per row at each call: the counterpart
of torch's old `quantize_dynamic`), the embeddings with `Int8WeightOnlyConfig`; other
tensors (norms, biases) stay float32. The int8 copy's validation loss is that quantized
model's own. The file is torchao's safetensors layout: a quantized `<module>.weight` is
stored as `<module>._weight_qdata` (int8), `<module>._weight_scale` (float32, one per row)
and `<module>._weight_zero_point` (int8, all 0: symmetric), the other tensors under their
own names; the metadata holds torchao's description of each tensor and `tensor_names`,
beside `model`, `weights` and `by`. To load it without Gangway, either into a `GPT` of
that config, which then runs quantized (torchao installed):

    tensors = safetensors.torch.load_file(path)
    metadata = safetensors.safe_open(path, "pt").metadata()
    state, _ = torchao.prototype.safetensors.safetensors_support.unflatten_tensor_state_dict(
        tensors, metadata
    )
    model.load_state_dict(state, assign=True)

or by hand, as float weights (`load_int8`): `weight = _weight_qdata.float() * _weight_scale`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from workers.engine.checkpoint import Checkpointer
from workers.engine.data import SyntheticTokens, TokenFile, TokenStream
from workers.engine.evaluation import evaluate
from workers.engine.gpt import GPT
from workers.engine.model_configs import MODEL_CONFIGS
from workers.program.context import RankContext

FULL = "model.safetensors"
INT8 = "model-int8.safetensors"


def export_model(
    ctx: RankContext,
    *,
    model: str,
    seed: int = 0,
    data_path: str | None = None,
    eval_batch: int = 16,
    eval_batches: int = 4,
    quantize: str = "none",
) -> dict[str, Any]:
    """Write the exported files and `export.json` to the outputs folder; report sizes
    and validation losses. `model`, `seed` and `data_path` are the trained job's (its
    held-out split); `eval_batch` x `eval_batches` sequences are evaluated."""
    if ctx.model_dir is None or ctx.outputs_dir is None:
        raise ValueError("an export starts from a model version (init_from) and writes outputs")
    if quantize not in ("none", "int8"):
        raise ValueError(f"quantize: none or int8, not {quantize!r}")
    net = consolidated(model, ctx.model_dir)
    stream = _held_out(model, seed, data_path)
    files: dict[str, Any] = {}
    weights = {name: t.detach().contiguous() for name, t in net.state_dict().items()}
    files[FULL] = _write(weights, {}, ctx.outputs_dir / FULL, model, "float32")
    files[FULL] |= evaluate(net, stream, batch_size=eval_batch, batches=eval_batches)
    if quantize == "int8":
        tensors, layout = quantized_int8(net)
        files[INT8] = _write(tensors, layout, ctx.outputs_dir / INT8, model, "int8")
        files[INT8] |= evaluate(net, stream, batch_size=eval_batch, batches=eval_batches)
    summary = {"model": model, "format": "safetensors", "files": files}
    (ctx.outputs_dir / "export.json").write_text(json.dumps(summary, indent=2))
    ctx.report(step=0, **_figures(files))
    return summary


def consolidated(model: str, checkpoint: Path) -> GPT:
    """A single-process model holding the checkpoint's weights (any dp/tp/pp)."""
    net = GPT(MODEL_CONFIGS[model])
    Checkpointer(None, [net], []).load_weights(checkpoint)
    return net.eval()


def quantized_int8(net: GPT) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Quantize `net` in place (torchao); its state as torchao's safetensors layout:
    the tensors to save and their string metadata."""
    # torchao's import logs that its optional CUDA kernels are absent, and torch logs
    # that torchao registers enums with pytree the old way: neither concerns an export.
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.prototype.safetensors.safetensors_support import (  # type: ignore[import-untyped]
            flatten_tensor_state_dict,
        )
        from torchao.quantization import (  # type: ignore[import-untyped]
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    quantize_(net, Int8DynamicActivationInt8WeightConfig())
    quantize_(net, Int8WeightOnlyConfig(), filter_fn=lambda m, _: isinstance(m, torch.nn.Embedding))
    tensors, layout = flatten_tensor_state_dict(net.state_dict())
    return tensors, layout


def load_int8(path: Path) -> dict[str, torch.Tensor]:
    """The float weights an int8 file stands for, by hand (no torchao): a model's state
    dict."""
    tensors = load_file(path)
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        module, _, field = name.rpartition(".")
        if field == "_weight_qdata":
            weights[f"{module}.weight"] = tensor.float() * tensors[f"{module}._weight_scale"]
        elif field not in ("_weight_scale", "_weight_zero_point"):
            weights[name] = tensor
    return weights


def _write(
    tensors: dict[str, torch.Tensor], layout: dict[str, str], path: Path, model: str, dtype: str
) -> dict[str, Any]:
    save_file(tensors, path, metadata=layout | {"model": model, "weights": dtype, "by": "gangway"})
    return {"bytes": path.stat().st_size}


def _held_out(model: str, seed: int, data_path: str | None) -> TokenStream:
    config = MODEL_CONFIGS[model]
    if data_path:
        return TokenFile(data_path, seq_len=config.seq_len, validation=True)
    return SyntheticTokens(
        vocab_size=config.vocab_size, seq_len=config.seq_len, seed=seed, validation=True
    )


def _figures(files: dict[str, dict[str, float]]) -> dict[str, float]:
    figures = {"bytes": files[FULL]["bytes"], "val_loss": files[FULL]["val_loss"]}
    if INT8 in files:
        figures |= {"bytes_int8": files[INT8]["bytes"], "val_loss_int8": files[INT8]["val_loss"]}
    return figures
