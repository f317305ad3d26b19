"""A small GPT-style decoder (nanoGPT shape), written so the engine can split it.

- q, k, v and both MLP layers are separate `nn.Linear`s, so tensor parallel can shard them
  column-wise (q/k/v, fc) and row-wise (proj) with torch's stock plans.
- Blocks live in a `ModuleDict` keyed by layer index: a pipeline stage keeps only its
  layers and its parameters keep the names they have in the full model, so a checkpoint
  written at one pipeline degree loads at another.
- A stage without the embeddings takes hidden states in; one without the head returns them.
- A stage may also start or end inside a block, at one of its pieces (attention, MLP in,
  MLP out: `PIECES`), so costly ends (a big vocabulary head) can be balanced at a finer
  grain than a whole block. Between MLP in and MLP out the boundary carries the residual
  stream and the MLP's hidden activation packed into one tensor (width 5 x n_embd).
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


# A block's pieces, in order: a pipeline stage may begin or end between any two.
ATTENTION, MLP_IN, MLP_OUT = range(3)
PIECES = 3
PIECE_NAMES = ("attention", "MLP in", "MLP out")


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc: nn.Linear | None = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj: nn.Linear | None = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(x))

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        assert self.fc is not None
        return F.gelu(self.fc(x))

    def out(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.proj is not None
        out: torch.Tensor = self.proj(hidden)
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_embd = config.n_embd
        self.ln1: nn.LayerNorm | None = nn.LayerNorm(config.n_embd)
        self.attn: CausalSelfAttention | None = CausalSelfAttention(config)
        self.ln2: nn.LayerNorm | None = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)
        self.pieces = range(PIECES)  # what this stage runs of the block (`cut`)
        self.recompute = False  # activation checkpointing: recompute in backward

    def cut(self, pieces: range) -> None:
        """Keep only `pieces` (contiguous) of this block; the others' parameters go, so a
        parameter lives on exactly one stage."""
        self.pieces = pieces
        if ATTENTION not in pieces:
            self.ln1 = self.attn = None
        if MLP_IN not in pieces:
            self.ln2 = self.mlp.fc = None
        if MLP_OUT not in pieces:
            self.mlp.proj = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self._forward, x, use_reentrant=False)
            return out
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.pieces) < PIECES:
            return self._forward_pieces(x)
        assert self.ln1 is not None and self.attn is not None and self.ln2 is not None
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out

    def _forward_pieces(self, x: torch.Tensor) -> torch.Tensor:
        """A cut block: the residual stream `x` and, between MLP in and MLP out, the MLP's
        hidden activation packed after it."""
        if self.pieces.start == MLP_OUT:
            x, hidden = torch.split(x, [self.n_embd, x.shape[-1] - self.n_embd], dim=-1)
        if self.ln1 is not None and self.attn is not None:
            x = x + self.attn(self.ln1(x))
        if self.ln2 is not None and self.mlp.fc is not None:
            hidden = self.mlp.hidden(self.ln2(x))
        if self.mlp.proj is None:
            return torch.cat([x, hidden], dim=-1) if MLP_IN in self.pieces else x
        out: torch.Tensor = x + self.mlp.out(hidden)
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

    def keep_only(self, units: range, *, first: bool, last: bool) -> None:
        """Make this model one pipeline stage: keep the block pieces in `units` (piece p
        of block b is unit b * PIECES + p) and drop the rest, the embeddings unless
        `first`, the final norm and head unless `last`."""
        for name in list(self.blocks):
            start = int(name) * PIECES
            pieces = range(max(units.start - start, 0), min(units.stop - start, PIECES))
            if not pieces:
                del self.blocks[name]
            elif len(pieces) < PIECES:
                block = self.blocks[name]
                assert isinstance(block, Block)
                block.cut(pieces)
        if not first:
            self.tok_emb = self.pos_emb = None
        if not last:
            self.ln_f = self.head = None


def block_units(layers: range) -> range:
    """The units (block pieces) of whole blocks `layers`."""
    return range(layers.start * PIECES, layers.stop * PIECES)


def boundary_width(config: GPTConfig, unit: int) -> int:
    """Width of the hidden state a stage starting at `unit` takes in: the residual
    stream, with the MLP's hidden activation packed after it before an MLP out."""
    return config.n_embd * (5 if unit % PIECES == MLP_OUT else 1)


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
