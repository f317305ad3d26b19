"""Biases drawn at random for tests that compare two forms of one model (pipeline stages
against the whole model, MLP slices against one fc and one proj).

`workers.engine.gpt._init_weights` zeroes every Linear's bias and torch starts a
LayerNorm's at zero, so with the model as built a bias added twice (or dropped) leaves
every output as it was: a test that compares outputs passes on that broken code (the
MLP test did, with `mlp.proj.0`'s bias added twice), and one that also compares
gradients sees it only there. Drawn biases make every one of them count in the outputs.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

Model = TypeVar("Model", bound=nn.Module)

# Large beside the weights' 0.02, so a bias counted twice moves the outputs well past the
# tests' tolerances; small enough that the attention scores stay in float32's comfort.
BIAS_STD = 0.1


def randomise_biases(model: Model, *, seed: int = 1) -> Model:
    """Every parameter named `bias`, drawn from N(0, BIAS_STD) in the order
    `named_parameters` gives (a generator of `seed`, so two models built alike draw
    alike: draw before `GPT.keep_only`, so each stage keeps the full model's values).
    Returns `model`."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] == "bias":
            nn.init.normal_(param, std=BIAS_STD, generator=generator)
    return model
