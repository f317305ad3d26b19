"""A deterministic synthetic token stream with structure a model can learn.

Each sequence follows a fixed affine rule `next = (a * tok + b) mod vocab` with a little
noise, so the loss falls well below ln(vocab) within tens of steps: a real signal that
training works, with no dataset to download. Batch (step, rank) is a pure function of the
seed, so data-parallel ranks see different data and a resumed job sees the same data.
"""

from __future__ import annotations

import torch


class SyntheticTokens:
    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, noise: float = 0.1) -> None:
        self.vocab_size, self.seq_len, self.seed, self.noise = vocab_size, seq_len, seed, noise
        self.multiplier = 5 if vocab_size % 5 else 7
        self.offset = 3

    def batch(self, *, step: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of shape (batch_size, seq_len)."""
        gen = torch.Generator().manual_seed(((self.seed * 1_000_003 + step) * 1009 + rank) % 2**63)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=gen)
        for pos in range(1, self.seq_len + 1):
            rule = (tokens[:, pos - 1] * self.multiplier + self.offset) % self.vocab_size
            noise = torch.randint(self.vocab_size, (batch_size,), generator=gen)
            use_noise = torch.rand(batch_size, generator=gen) < self.noise
            tokens[:, pos] = torch.where(use_noise, noise, rule)
        return tokens[:, :-1], tokens[:, 1:]
