"""Named sizes of the built-in GPT-style decoder (no torch here: the API validates names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    n_embd: int


MODEL_CONFIGS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(vocab_size=256, seq_len=64, n_layer=4, n_head=2, n_embd=64),
    # For CPU benchmarks: big enough that compute, not overhead, sets the pace (~16M).
    "gpt-mini": GPTConfig(vocab_size=8192, seq_len=256, n_layer=6, n_head=8, n_embd=384),
    "gpt-small": GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt-medium": GPTConfig(vocab_size=50304, seq_len=1024, n_layer=24, n_head=16, n_embd=1024),
}
