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

int8: every 2-D weight (linear layers and embeddings) is quantized per output row,
symmetric (scale = max |w| / 127, what `torch.quantize_per_channel` computes; torch's
quantized tensor types are deprecated, pytorch#184982, so the int8 values are made here);
the file holds them under the weight's name and the row scales under `<name>::scale`;
other tensors (norms, biases) stay float32. To load it without Gangway:
`weight = int8.float() * scale[:, None]`. The int8 copy's validation loss is measured
with exactly those weights.
"""

from __future__ import annotations

import json
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

SCALE_SUFFIX = "::scale"
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
    weights = {name: t.detach().contiguous() for name, t in net.state_dict().items()}
    summary: dict[str, Any] = {"model": model, "format": "safetensors", "files": {}}
    summary["files"][FULL] = _write(weights, ctx.outputs_dir / FULL, model, "float32")
    summary["files"][FULL] |= evaluate(net, stream, batch_size=eval_batch, batches=eval_batches)
    if quantize == "int8":
        packed = quantized_int8(weights)
        summary["files"][INT8] = _write(packed, ctx.outputs_dir / INT8, model, "int8")
        net.load_state_dict(dequantized(packed))
        summary["files"][INT8] |= evaluate(net, stream, batch_size=eval_batch, batches=eval_batches)
    (ctx.outputs_dir / "export.json").write_text(json.dumps(summary, indent=2))
    ctx.report(step=0, **_figures(summary["files"]))
    return summary


def consolidated(model: str, checkpoint: Path) -> GPT:
    """A single-process model holding the checkpoint's weights (any dp/tp/pp)."""
    net = GPT(MODEL_CONFIGS[model])
    Checkpointer(None, [net], []).load_weights(checkpoint)
    return net.eval()


def quantized_int8(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every 2-D float weight as int8 per output row, with its scales; the rest as is."""
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if tensor.dim() != 2 or not tensor.is_floating_point():
            packed[name] = tensor
            continue
        scales = (tensor.float().abs().amax(dim=1) / 127).clamp(min=1e-12)
        rows = torch.round(tensor.float() / scales[:, None]).clamp(-127, 127)
        packed[name] = rows.to(torch.int8).contiguous()
        packed[name + SCALE_SUFFIX] = scales
    return packed


def dequantized(packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float weights an int8 file stands for (what a server would compute)."""
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in packed.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = packed.get(name + SCALE_SUFFIX)
        weights[name] = tensor.float() * scale[:, None] if scale is not None else tensor
    return weights


def load_int8(path: Path) -> dict[str, torch.Tensor]:
    return dequantized(load_file(path))


def _write(tensors: dict[str, torch.Tensor], path: Path, model: str, dtype: str) -> dict[str, Any]:
    save_file(tensors, path, metadata={"model": model, "weights": dtype, "by": "gangway"})
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
