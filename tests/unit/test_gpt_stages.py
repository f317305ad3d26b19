"""Pipeline stages cut inside blocks: the stages, run one after the other, are the model."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.gpt import GPT, PIECES, boundary_width
from workers.model_configs import MODEL_CONFIGS

CONFIG = MODEL_CONFIGS["gpt-tiny"]
UNITS = CONFIG.n_layer * PIECES


def stages_of(cuts: list[int]) -> list[GPT]:
    bounds = [0, *sorted(cuts), UNITS]
    stages = []
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        torch.manual_seed(0)
        model = GPT(CONFIG)
        model.keep_only(range(a, b), first=s == 0, last=s == len(bounds) - 2)
        stages.append(model)
    return stages


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, UNITS), max_size=3))
def test_stages_cut_anywhere_compute_the_full_model_and_share_no_parameter(
    cuts: list[int],
) -> None:
    torch.manual_seed(0)
    full = GPT(CONFIG)
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    stages = stages_of(cuts)
    x = tokens
    for stage, start in zip(stages, [0, *sorted(cuts)], strict=True):
        if stage is not stages[0]:
            assert x.shape[-1] == boundary_width(CONFIG, start)  # what the stage is sent
        x = stage(x)
    torch.testing.assert_close(x, full(tokens), rtol=0, atol=1e-5)
    names = [n for stage in stages for n, _ in stage.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in full.named_parameters())  # each once
