"""Token streams indexed by sample, so any data-parallel degree reads the same data.

Step s of a run with global batch G consumes samples [s*G, (s+1)*G) of the stream; data-
parallel rank r of dp takes the r-th contiguous slice of them. The samples a step sees do
not depend on dp, so a job resumed at another degree (or compared with one process)
continues exactly where it stopped: no sample repeated, none skipped. The position to
checkpoint is simply the number of samples consumed.

- `SyntheticTokens`: each sequence follows `next = (a * tok + b) mod vocab` with a little
  noise, seeded per sample: a signal the model learns in tens of steps, nothing to download.
- `TokenFile`: a flat file of uint16 token ids (nanoGPT's `train.bin`), memory-mapped;
  sample i is the window starting at i * seq_len (wrapping around the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class TokenStream(Protocol):
    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of samples [start, start + count), each
        of shape (count, seq_len)."""
        ...


def rank_slice(step_start: int, global_batch: int, dp_rank: int, dp: int) -> tuple[int, int]:
    """(first sample, count) that data-parallel rank `dp_rank` reads of one global batch."""
    per_rank = global_batch // dp
    return step_start + dp_rank * per_rank, per_rank


class SyntheticTokens:
    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, noise: float = 0.1) -> None:
        self.vocab_size, self.seq_len, self.seed, self.noise = vocab_size, seq_len, seed, noise
        self.multiplier = 5 if vocab_size % 5 else 7
        self.offset = 3

    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._sequence(index) for index in range(start, start + count)]
        tokens = torch.stack(rows)
        return tokens[:, :-1], tokens[:, 1:]

    def _sequence(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + index) % 2**63)
        length = self.seq_len + 1
        noise = torch.randint(self.vocab_size, (length,), generator=gen)
        use_noise = (torch.rand(length, generator=gen) < self.noise).tolist()
        values = noise.tolist()
        for pos in range(1, length):
            if not use_noise[pos]:
                values[pos] = (values[pos - 1] * self.multiplier + self.offset) % self.vocab_size
        return torch.tensor(values, dtype=torch.long)


class TokenFile:
    def __init__(self, path: Path | str, *, seq_len: int) -> None:
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        if len(self.tokens) < seq_len + 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than seq_len + 1")
        self.seq_len = seq_len

    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        total = len(self.tokens)
        windows = []
        for index in range(start, start + count):
            first = (index * self.seq_len) % (total - self.seq_len)
            windows.append(self.tokens[first : first + self.seq_len + 1].astype(np.int64))
        tokens = torch.from_numpy(np.stack(windows))
        return tokens[:, :-1], tokens[:, 1:]
