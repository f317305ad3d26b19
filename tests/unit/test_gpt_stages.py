"""Pipeline stages cut inside blocks and inside the head: the stages, run one after the
other, are the model (its loss and its gradients). Every model here has random biases
(`tests.random_biases`): as built they are zero, and a bias added twice would leave the
outputs as they were."""

from __future__ import annotations

import itertools
from typing import cast

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness.older_models import WholeMLP, linears
from tests.random_biases import randomise_biases
from workers.engine.gpt import (
    GPT,
    MLP_SLICES,
    Block,
    boundary_width,
    next_token_loss,
    splits_head,
    total_units,
)
from workers.engine.model_configs import MODEL_CONFIGS

CONFIG = MODEL_CONFIGS["gpt-tiny"]
UNITS = total_units(CONFIG)  # 4 blocks x 5 pieces, then the head's 4 slices


def stages_of(cuts: list[int]) -> list[GPT]:
    bounds = [0, *sorted(cuts), UNITS]
    units = [range(a, b) for a, b in itertools.pairwise(bounds)]
    stages = []
    for s, held in enumerate(units):
        torch.manual_seed(0)
        model = randomise_biases(GPT(CONFIG))  # drawn before the cut, as the full model's
        model.keep_only(held, first=s == 0)
        stages.append(model)
    return stages


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, UNITS - 1), max_size=3, unique=True))
def test_stages_cut_anywhere_compute_the_full_model_and_share_no_parameter(
    cuts: list[int],
) -> None:
    torch.manual_seed(0)
    full = randomise_biases(GPT(CONFIG))
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    targets = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    expected = next_token_loss(full(tokens), targets)
    expected.backward()  # type: ignore[no-untyped-call]
    stages = stages_of(cuts)
    bounds = [0, *sorted(cuts), UNITS]
    split_head = splits_head(CONFIG, [range(a, b) for a, b in itertools.pairwise(bounds)])
    x, carried = tokens, targets
    for stage, start in zip(stages, [0, *sorted(cuts)], strict=True):
        if stage is not stages[0]:
            assert x.shape[-1] == boundary_width(CONFIG, start)  # what the stage is sent
        out = stage(x, carried) if split_head else stage(x)
        x, carried = out if isinstance(out, tuple) else (out, carried)
    loss = next_token_loss(x, targets)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-5)
    grads = {n: p.grad for stage in stages for n, p in stage.named_parameters()}
    assert sorted(grads) == sorted(n for n, _ in full.named_parameters())  # each once
    for name, param in full.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=0, atol=1e-6)


def test_the_full_head_is_the_concatenated_slices() -> None:
    """One matrix product over the slices' rows in order: the logits of an unsplit head."""
    torch.manual_seed(0)
    model = randomise_biases(GPT(CONFIG))  # ln_f's bias among them
    hidden = torch.randn(2, CONFIG.seq_len, CONFIG.n_embd)
    assert model.ln_f is not None
    normed = model.ln_f(hidden)
    by_slice = torch.cat([piece(normed) for piece in model.head.values()], dim=-1)
    model.blocks.clear()
    model.tok_emb = model.pos_emb = None
    torch.testing.assert_close(model(hidden), by_slice)


def test_the_mlp_is_one_fc_and_one_proj_in_slices_of_its_hidden_width() -> None:
    """The slices' weights side by side (fc's rows, proj's columns) are the unsliced MLP:
    the same output, so a checkpoint of one loads into the other."""
    torch.manual_seed(0)
    mlp = cast(Block, randomise_biases(GPT(CONFIG)).blocks["0"]).mlp
    assert len(mlp.fc) == MLP_SLICES
    assert all(piece.bias is None for piece in linears(mlp.proj)[1:])  # proj.0 has it
    h = torch.randn(2, CONFIG.seq_len, CONFIG.n_embd)
    torch.testing.assert_close(mlp(h), WholeMLP(mlp)(h))
