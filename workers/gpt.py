"""A small GPT-style decoder (nanoGPT shape), written so the engine can split it.

- q, k, v and both MLP layers are separate `nn.Linear`s, so tensor parallel can shard them
  column-wise (q/k/v, fc) and row-wise (proj) with torch's stock plans.
- Blocks live in a `ModuleDict` keyed by layer index: a pipeline stage keeps only its
  layers and its parameters keep the names they have in the full model, so a checkpoint
  written at one pipeline degree loads at another.
- A stage without the embeddings takes hidden states in; one without the head returns them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workers.model_configs import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.head_dim = config.n_embd // config.n_head
        self.wq = nn.Linear(config.n_embd, config.n_embd)
        self.wk = nn.Linear(config.n_embd, config.n_embd)
        self.wv = nn.Linear(config.n_embd, config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallel each rank holds n_head / tp of them.
        shape = (batch, seq, -1, self.head_dim)
        q, k, v = (w(x).view(shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(batch, seq, -1))
        return out


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(F.gelu(self.fc(x)))
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)
        self.recompute = False  # activation checkpointing: recompute in backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self._forward, x, use_reentrant=False)
            return out
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb: nn.Embedding | None = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb: nn.Embedding | None = nn.Embedding(config.seq_len, config.n_embd)
        self.blocks = nn.ModuleDict({str(i): Block(config) for i in range(config.n_layer)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(config.n_embd)
        # Not tied to tok_emb (GPT-2 ties them): the first and last pipeline stages hold
        # one each, and the model is the same at every pipeline degree.
        self.head: nn.Linear | None = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        x = tokens_or_hidden
        if self.tok_emb is not None and self.pos_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks.values():
            x = block(x)
        if self.ln_f is not None and self.head is not None:
            x = self.head(self.ln_f(x))
        return x

    def keep_only(self, layers: range, *, first: bool, last: bool) -> None:
        """Make this model one pipeline stage: drop the layers outside `layers`, the
        embeddings unless `first`, the final norm and head unless `last`."""
        for name in list(self.blocks):
            if int(name) not in layers:
                del self.blocks[name]
        if not first:
            self.tok_emb = self.pos_emb = None
        if not last:
            self.ln_f = self.head = None


def _init_weights(module: nn.Module) -> None:
    """GPT-2's init: small normal weights, so the first loss is near ln(vocab)."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def parameter_count(config: GPTConfig) -> int:
    """Parameters of the full model, without building it (for MFU)."""
    e, v = config.n_embd, config.vocab_size
    block = 4 * (e * e + e) + (e * 4 * e + 4 * e) + (4 * e * e + e) + 2 * 2 * e
    return 2 * v * e + config.seq_len * e + config.n_layer * block + 2 * e


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
