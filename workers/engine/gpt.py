"""A small GPT-style decoder (nanoGPT shape), written so the engine can split it.

- q, k, v and the MLP's layers are separate `nn.Linear`s, so tensor parallel can shard them
  column-wise (q/k/v, fc) and row-wise (proj) with torch's plans (`workers.engine.parallelize`).
- Blocks live in a `ModuleDict` keyed by layer index: a pipeline stage keeps only its
  layers and its parameters keep the names they have in the full model, so a checkpoint
  written at one pipeline degree loads at another.
- A stage without the embeddings takes hidden states in; one without the head returns them
  (with the target ids beside them where the head is split, below).
- A stage may also start or end inside a block, at one of its pieces (attention, then the
  MLP's `MLP_SLICES` slices of its hidden width: `PIECES`), so costly ends (a big
  vocabulary head) can be balanced at a finer grain than a whole block. MLP slice c is
  `mlp.fc.c` (n_embd -> its columns of the hidden width) then `mlp.proj.c` (those columns
  -> n_embd); the MLP's output is the sum of its slices' (the same product as one fc and
  one proj, split along the hidden width), `mlp.proj.0` carrying the bias. A boundary
  inside the MLP carries the residual stream with the earlier slices' outputs added and
  the normed input the later slices take, packed into one tensor (width 2 x n_embd).
- The head is `HEAD_PIECES` row slices of the vocabulary (`head.0` ... `head.3`), so it
  too can be spread over stages where it costs more than a stage's share (gpt-mini's head
  costs 1.7 blocks). A stage holding some of the slices adds their logits to a running
  log-sum-exp (the running max, the sum of exponentials, the target's logit: 3 values
  per token packed after the normed hidden state); the stage holding the last slice
  returns each token's loss. The target ids then travel with the activations from the
  first stage (`splits_head`), since a middle stage needs them to pick out the
  target's logit. One process, or a stage holding the whole head, computes the logits in
  one matrix product as before.
"""

from __future__ import annotations

import functools
import itertools
import operator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workers.engine.model_configs import GPTConfig


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


# The head's vocabulary slices: a pipeline stage may hold some of them (`head_rows`).
HEAD_PIECES = 4
# What a stage inside the head sends on besides the normed hidden state: the running max
# of the logits, the sum of their exponentials below it, the target's logit.
HEAD_STATS = 3


# A block's pieces, in order: a pipeline stage may begin or end between any two. The MLP's
# hidden width is in MLP_SLICES slices, one piece each: its two Linears are 2/3 of a
# block's time, so in quarters a stage's end moves in steps of ~1/7 of a block (halves
# would be no finer than the MLP in | MLP out cut they replace).
MLP_SLICES = 4
ATTENTION, MLP_FIRST = 0, 1
PIECES = 1 + MLP_SLICES


class MLP(nn.Module):
    """fc, GELU, proj, in slices of the hidden width (`mlp_slices`). Under tensor
    parallel each slice is column- then row-wise and their partial sums are added before
    the one all-reduce (`workers.engine.parallelize`)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        widths = [len(r) for r in mlp_slices(4 * config.n_embd)]
        e = config.n_embd
        self.fc = nn.ModuleDict({str(c): nn.Linear(e, w) for c, w in enumerate(widths)})
        self.proj = nn.ModuleDict(
            {str(c): nn.Linear(w, e, bias=c == 0) for c, w in enumerate(widths)}
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The held slices' part of the MLP's output for the normed input `h`."""
        parts = [self.proj[c](F.gelu(fc(h))) for c, fc in self.fc.items()]
        out: torch.Tensor = functools.reduce(operator.add, parts)
        return out

    def keep(self, slices: range) -> None:
        """Drop the slices a pipeline stage does not hold."""
        for c in list(self.fc):
            if int(c) not in slices:
                del self.fc[c], self.proj[c]


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
        parameter lives on exactly one stage (the MLP's norm with its first slice)."""
        self.pieces = pieces
        if ATTENTION not in pieces:
            self.ln1 = self.attn = None
        if MLP_FIRST not in pieces:
            self.ln2 = None
        self.mlp.keep(range(max(pieces.start - MLP_FIRST, 0), max(pieces.stop - MLP_FIRST, 0)))

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
        """A cut block. Inside the MLP, the residual stream `x` (the earlier slices'
        outputs added) travels with the normed input `h` packed after it."""
        if self.pieces.start > MLP_FIRST:
            x, h = torch.split(x, self.n_embd, dim=-1)
        if self.ln1 is not None and self.attn is not None:
            x = x + self.attn(self.ln1(x))
        if self.ln2 is not None:
            h = self.ln2(x)
        if self.mlp.fc:
            x = x + self.mlp(h)
        if MLP_FIRST < self.pieces.stop < PIECES:
            return torch.cat([x, h], dim=-1)
        return x


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
        self.rows = head_rows(config)
        self.head = nn.ModuleDict(
            {str(c): nn.Linear(config.n_embd, len(r), bias=False) for c, r in enumerate(self.rows)}
        )
        self.apply(_init_weights)

    def forward(
        self, tokens_or_hidden: torch.Tensor, targets: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits, or a stage's hidden state; with `targets` (a stage of a split head):
        (hidden state, targets) for the next stage, or the last stage's per-token loss."""
        x = tokens_or_hidden
        if self.tok_emb is not None and self.pos_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks.values():
            x = block(x)
        if not self.head:
            return x if targets is None else (x, targets.clone())
        if targets is None:
            assert len(self.head) == len(self.rows), "a split head needs the targets"
            return self._logits(x)
        x = self._head_slices(x, targets)
        # The clone: the pipeline detaches its outputs in place, and a microbatch's targets
        # on the first stage are a view of the batch's.
        return x if self._holds_last_slice else (x, targets.clone())

    @property
    def _holds_last_slice(self) -> bool:
        return str(len(self.rows) - 1) in self.head

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The slices' logits side by side: the same products as one head's (a product
        over the concatenated weights would keep a copy of them for backward)."""
        assert self.ln_f is not None
        h = self.ln_f(x)
        return torch.cat([piece(h) for piece in self.head.values()], dim=-1)

    def _head_slices(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The held vocabulary slices' part of the loss: logits added to the running
        log-sum-exp; the last slice's stage returns each token's loss (in eval mode, with
        its hit: `token_losses_and_hits`). The max is a constant to the gradient (any
        shift gives the same log-sum-exp), so it is detached. Target ids of other
        slices, or the garbage the pipeline's shape inference sends, select nothing."""
        if self.ln_f is not None:  # the first slice
            h = self.ln_f(x)
            stats = torch.zeros(*h.shape[:-1], HEAD_STATS, device=h.device)
            stats[..., 0] = -torch.inf
        else:
            h, stats = torch.split(x, [x.shape[-1] - HEAD_STATS, HEAD_STATS], dim=-1)
        top, total, target_logit = (stats[..., i : i + 1].float() for i in range(HEAD_STATS))
        for name, piece in self.head.items():
            rows = self.rows[int(name)]
            logits = piece(h).float()
            new_top = torch.maximum(top, logits.amax(-1, keepdim=True)).detach()
            total = total * torch.exp(top - new_top)
            total = total + torch.exp(logits - new_top).sum(-1, keepdim=True)
            top = new_top
            local = (targets - rows.start).unsqueeze(-1)
            inside = (local >= 0) & (local < len(rows))
            picked = logits.gather(-1, local.clamp(0, len(rows) - 1))
            target_logit = target_logit + torch.where(inside, picked, 0.0)
        if not self._holds_last_slice:
            return torch.cat([h.float(), top, total, target_logit], dim=-1)
        loss = (top + torch.log(total) - target_logit).squeeze(-1)  # each token's
        if self.training:
            return loss
        # Evaluation (`model.eval()`): with whether the target's logit is the largest.
        return torch.stack([loss, (target_logit >= top).squeeze(-1).float()], dim=-1)

    def keep_only(self, units: range, *, first: bool) -> None:
        """Make this model one pipeline stage: keep the pieces in `units` and drop the
        rest, the embeddings unless `first`. Piece p of block b is unit b * PIECES + p;
        after the blocks come the head's slices (`head_units`), the first with the final
        norm. Where the head is split over stages (`splits_head`), every stage is called
        with the target ids too and passes them on."""
        head = head_units(self.config)
        for c in list(self.head):
            if head.start + int(c) not in units:
                del self.head[c]
        if head.start not in units:
            self.ln_f = None
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


def head_rows(config: GPTConfig) -> list[range]:
    return vocabulary_slices(config.vocab_size)


def vocabulary_slices(vocab_size: int) -> list[range]:
    """The vocabulary rows of each head slice."""
    return even_slices(vocab_size, HEAD_PIECES)


def mlp_slices(width: int) -> list[range]:
    """The columns of the MLP's hidden width (4 x n_embd) each MLP slice holds."""
    return even_slices(width, MLP_SLICES)


def even_slices(size: int, pieces: int) -> list[range]:
    """`pieces` contiguous slices of range(size) (fewer if size is smaller), their sizes
    at most one apart, none empty."""
    pieces = min(pieces, size)
    bounds = [c * size // pieces for c in range(pieces + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def head_units(config: GPTConfig) -> range:
    """The units of the head's slices, after every block's pieces."""
    start = config.n_layer * PIECES
    return range(start, start + len(head_rows(config)))


def total_units(config: GPTConfig) -> int:
    return head_units(config).stop


def block_units(config: GPTConfig, layers: range, *, last: bool) -> range:
    """The units of whole blocks `layers`, and of the whole head for the `last` stage."""
    return range(layers.start * PIECES, total_units(config) if last else layers.stop * PIECES)


def splits_head(config: GPTConfig, units: list[range]) -> bool:
    """Whether a stage other than the last holds a head slice (the targets must travel)."""
    return len(units) > 1 and units[-1].start > head_units(config).start


def boundary_width(config: GPTConfig, unit: int) -> int:
    """Width of the hidden state a stage starting at `unit` takes in: the residual
    stream, with the MLP's normed input packed after it inside the MLP, and the running
    log-sum-exp after the normed hidden state inside the head."""
    if unit > head_units(config).start:
        return config.n_embd + HEAD_STATS
    return config.n_embd * (2 if unit % PIECES > MLP_FIRST else 1)


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


def next_token_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of the next token. `output`: logits (batch, seq, vocab), or the
    per-token losses (batch, seq) the last stage of a split head computes."""
    if output.dim() == targets.dim():
        return output.float().mean()
    return F.cross_entropy(output.flatten(0, 1).float(), targets.flatten())


def token_losses_and_hits(
    output: torch.Tensor, targets: torch.Tensor, *, split_head: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's next-token loss, and 1.0 where its target's logit is the largest (the
    argmax; a tie counts as a hit), for a validation pass. `output`: the logits (batch,
    seq, vocab), or where the head is split over pipeline stages the last stage's eval-mode
    (loss, hit) pairs (batch, seq, 2)."""
    if split_head:
        losses, hits = output.float().unbind(-1)
        return losses, hits
    logits = output.float()
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    hits = (target_logits >= logits.amax(-1)).float()
    return losses.view_as(targets), hits
