"""The model as releases before its head's and its MLPs' slices saved it: checkpoints
they wrote (`workers.engine.checkpoint_compat`), and what the slices cost
(`bench/engine_balance.py`)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine.gpt import GPT, MLP, Block


def linears(pieces: nn.ModuleDict) -> list[nn.Linear]:
    return [cast(nn.Linear, piece) for piece in pieces.values()]


class WholeMLP(nn.Module):
    """An MLP as releases before its slices saved it: one `fc`, one `proj`."""

    def __init__(self, sliced: MLP) -> None:
        super().__init__()
        fc, proj = linears(sliced.fc), linears(sliced.proj)
        self.fc = nn.Linear(fc[0].in_features, sum(p.out_features for p in fc))
        self.proj = nn.Linear(self.fc.out_features, proj[0].out_features)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([p.weight for p in fc]))
            self.fc.bias.copy_(torch.cat([p.bias for p in fc]))
            self.proj.weight.copy_(torch.cat([p.weight for p in proj], dim=1))
            self.proj.bias.copy_(proj[0].bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(F.gelu(self.fc(h)))
        return out


class OlderGPT(nn.Module):
    """The model as releases before the head's and the MLPs' slices saved it: the same
    parameters in the same order, the head one `head.weight`, each MLP whole."""

    def __init__(self, sliced: GPT) -> None:
        super().__init__()
        for name, child in sliced.named_children():
            if name != "head":
                self.add_module(name, child)
        for block in sliced.blocks.values():
            block.mlp = WholeMLP(cast(Block, block).mlp)
        self.head = nn.Linear(sliced.config.n_embd, sliced.config.vocab_size, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.cat([p.weight for p in linears(sliced.head)]))
