"""Validation figures from one process (`workers.engine.evaluation`): a pipeline's split
head hands its last stage each token's hit, the same argmax as the full model's logits."""

from __future__ import annotations

import math

import torch

from tests.random_biases import randomise_biases
from tests.unit.test_gpt_stages import CONFIG, stages_of
from workers.engine.evaluation import StepLoss, Tally
from workers.engine.gpt import GPT, token_losses_and_hits


def test_a_split_heads_last_stage_counts_what_the_full_logits_do() -> None:
    torch.manual_seed(0)
    full = randomise_biases(GPT(CONFIG)).eval()  # as `stages_of` draws them
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    targets = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    with torch.no_grad():
        logits = full(tokens)
        assert isinstance(logits, torch.Tensor)
        x, carried = tokens, targets
        for stage in stages_of([4, 21, 22]):  # the head's 4 slices over 3 stages
            out = stage.eval()(x, carried)
            x, carried = out if isinstance(out, tuple) else (out, carried)
    losses, hits = token_losses_and_hits(x, targets, split_head=True)
    expected_losses, expected_hits = token_losses_and_hits(logits, targets, split_head=False)
    assert torch.allclose(losses, expected_losses, atol=1e-5)
    assert torch.equal(hits, expected_hits)
    assert torch.equal(expected_hits, (logits.argmax(-1) == targets).float())


def test_a_pass_tallies_summed_loss_hits_and_tokens_and_training_is_untouched() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    targets = torch.randint(5, (2, 3))
    loss = StepLoss(accumulation=2)
    mean = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert torch.allclose(loss(logits, targets), mean / 2)
    loss.tally = Tally(torch.device("cpu"), split_head=False)
    assert torch.allclose(loss(logits, targets), mean)
    loss_sum, hits, tokens = loss.tally.sums.tolist()
    assert math.isclose(loss_sum / tokens, mean.item(), rel_tol=1e-6)
    assert (hits, tokens) == ((logits.argmax(-1) == targets).sum().item(), 6)
