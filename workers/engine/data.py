"""Token streams indexed by sample, so any data-parallel degree reads the same data.

Step s of a run with global batch G consumes samples [s*G, (s+1)*G) of the stream; data-
parallel rank r of dp takes the r-th contiguous slice of them. The samples a step sees do
not depend on dp, so a job resumed at another degree (or compared with one process)
continues exactly where it stopped: no sample repeated, none skipped. The position to
checkpoint is simply the number of samples consumed.

- `SyntheticTokens`: each sequence follows `next = (a * tok + b) mod vocab` with a little
  noise, seeded per sample: a signal the model learns in tens of steps, nothing to download.
- `TokenFile`: a flat file of uint16 token ids (nanoGPT's `train.bin`), memory-mapped;
  sample i is the window of seq_len + 1 tokens starting at i * seq_len.

Each source has a held-out validation split (`validation=True`), which training never
reads: for `SyntheticTokens`, the samples from index `VALIDATION_OFFSET` on (the same
generator, so the same distribution); for `TokenFile`, the last 5% of its windows (at
least one): training wraps around the first 95%, validation around the rest.
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


# Where SyntheticTokens' validation samples start. Its generator keeps 32 bits of a seed,
# so the samples repeat every 2**32: half way round, no run of fewer than 2**31 samples
# trains on them (2**40, a multiple of 2**32, gave the training samples back).
VALIDATION_OFFSET = 2**31
# The share of a TokenFile's windows held out for validation.
HELD_OUT = 0.05


class SyntheticTokens:
    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        seed: int,
        noise: float = 0.1,
        validation: bool = False,
    ) -> None:
        self.vocab_size, self.seq_len, self.seed, self.noise = vocab_size, seq_len, seed, noise
        self.multiplier = 5 if vocab_size % 5 else 7
        self.offset = 3
        self.first = VALIDATION_OFFSET if validation else 0

    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.first + start
        rows = [self._sequence(index) for index in range(first, first + count)]
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
    def __init__(self, path: Path | str, *, seq_len: int, validation: bool = False) -> None:
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        windows = (len(self.tokens) - 1) // seq_len  # of seq_len + 1 tokens, seq_len apart
        if windows < 2:
            raise ValueError(
                f"{path}: {len(self.tokens)} tokens, fewer than seq_len + 1 for each of a "
                "training and a validation window"
            )
        held_out = max(1, int(windows * HELD_OUT))
        self.first, self.windows = (
            (windows - held_out, held_out) if validation else (0, windows - held_out)
        )
        self.seq_len = seq_len

    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        windows = []
        for index in range(start, start + count):
            first = (self.first + index % self.windows) * self.seq_len
            windows.append(self.tokens[first : first + self.seq_len + 1].astype(np.int64))
        tokens = torch.from_numpy(np.stack(windows))
        return tokens[:, :-1], tokens[:, 1:]
