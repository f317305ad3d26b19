"""Validation passes of the built-in trainer: the loss, perplexity and token accuracy of
the model on the held-out split (`workers.engine.data`), at any plan.

One pass reads `batches` batches of `batch_size` sequences per data-parallel rank, batch
b being samples [b x G, (b + 1) x G) of the split for a global batch G = dp x
batch_size, sliced over dp as training slices its batches: a pass sees the same samples
at every dp, so a run's figures equal one process's (`tests/integration/test_engine.py`).
Forward only, under `torch.no_grad` and `model.eval()`; with a pipeline, the schedule's
forward-only `eval`. The logits exist only on the last stage, where the schedule calls
the loss function: `StepLoss` tallies the sums there while a pass runs (with a split head,
the last stage's eval mode hands it each token's hit beside its loss, `GPT._head_slices`).
The sums (loss x tokens, hits, tokens) of the last stage's tensor-parallel rank 0 of every
data-parallel rank go into one all-reduce; every rank then knows the figures.

Under `local-sgd`, `diloco` and `adaptive`, each replica evaluates its own parameters on
its slice, as they stand between syncs. `async` jobs are not evaluated.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from workers import faults
from workers.engine.data import TokenStream, rank_slice
from workers.engine.gpt import next_token_loss, token_losses_and_hits
from workers.engine.parallelize import ModelParts
from workers.engine.plan import ParallelPlan

# The fault point that makes a training step's loss NaN (`workers.faults`, action `nan`).
POISON_POINT = "engine.loss"


class Tally:
    """One validation pass's sums on this rank: loss x tokens, hits, tokens."""

    def __init__(self, device: torch.device, *, split_head: bool) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        self.split_head = split_head

    def add(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Count one (micro)batch; its mean loss, which a pipeline schedule keeps."""
        losses, hits = token_losses_and_hits(output, targets, split_head=self.split_head)
        counted = torch.stack([losses.sum(), hits.sum(), losses.new_tensor(losses.numel())])
        self.sums += counted.to(self.sums)
        return losses.mean()


class StepLoss:
    """The loss function of the step (a pipeline schedule calls it on the last stage, per
    microbatch): mean next-token cross entropy over `accumulation` micro-steps. While a
    validation pass runs (`tally` set) it counts into the tally instead. `poisoned`: a
    test's fault made this training step's loss NaN (`_Loop.step` asks once a step)."""

    def __init__(self, accumulation: int) -> None:
        self.accumulation = accumulation
        self.tally: Tally | None = None
        self.poisoned = False

    def __call__(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.tally is not None:
            return self.tally.add(output, targets)
        loss = next_token_loss(output, targets) / self.accumulation
        return loss * math.nan if self.poisoned else loss

    def poison_this_step(self) -> None:
        """Ask the fault point once per training step (`@N` counts steps)."""
        self.poisoned = faults.poison(POISON_POINT)


class Evaluator:
    """Runs validation passes for one rank of a plan."""

    def __init__(
        self,
        *,
        plan: ParallelPlan,
        parts: ModelParts,
        loss: StepLoss,
        stream: TokenStream,
        batch_size: int,
        batches: int,
        dp_rank: int,
        counts: bool,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self.plan, self.parts, self.loss, self.stream = plan, parts, loss, stream
        self.batch_size, self.batches, self.dp_rank = batch_size, batches, dp_rank
        self.counts, self.device, self.autocast = counts, device, autocast

    def run(self) -> dict[str, float]:
        """One pass on every rank of the plan: val_loss, val_perplexity,
        val_token_accuracy (each the same on every rank). A bf16 job under autocast also
        gets its fp32 shadow: the same pass without autocast, `val_loss_fp32` and
        `precision_drift` (|val_loss - val_loss_fp32| / val_loss_fp32), so precision loss
        shows as a number. Not under FSDP, whose bf16 parameters have no fp32 copy to run."""
        figures = _figures(self._pass(self.autocast))
        if self.plan.precision == "bf16" and not self.plan.fsdp:
            shadow = _figures(self._pass(contextlib.nullcontext))["val_loss"]
            figures["val_loss_fp32"] = shadow
            figures["precision_drift"] = abs(figures["val_loss"] - shadow) / shadow
        return figures

    def _pass(self, autocast: Callable[[], contextlib.AbstractContextManager[Any]]) -> torch.Tensor:
        """This rank's sums over the split's first `batches` global batches."""
        tally = Tally(self.device, split_head=self.parts.carries_targets)
        self.loss.tally = tally
        for part in self.parts.parts:
            part.eval()
        try:
            with torch.no_grad(), autocast():
                global_batch = self.plan.dp * self.batch_size
                for batch in range(self.batches):
                    start, count = rank_slice(
                        batch * global_batch, global_batch, self.dp_rank, self.plan.dp
                    )
                    inputs, targets = self.stream.samples(start, count)
                    self._forward(inputs.to(self.device), targets.to(self.device))
        finally:
            self.loss.tally = None
            for part in self.parts.parts:
                part.train()
        return tally.sums if self.counts else torch.zeros_like(tally.sums)

    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """The model's forward, the loss function tallying. Not through DDP: a forward
        without backward has nothing for it to do."""
        schedule = self.parts.schedule
        if schedule is None:
            self.loss(self.parts.parts[0](inputs), targets)
            return
        args: tuple[torch.Tensor, ...] = ()
        if self.parts.first:
            args = (inputs, targets) if self.parts.carries_targets else (inputs,)
        target = targets if self.parts.last(self.plan) else None
        schedule.eval(*args, target=target, return_outputs=False)


def evaluate(
    model: torch.nn.Module, stream: TokenStream, *, batch_size: int, batches: int
) -> dict[str, float]:
    """A pass of one whole model in one process (an export, a check): `batches` batches
    of `batch_size` samples from the split's start, the figures `Evaluator.run` gives
    when its dp x batch_size is `batch_size`."""
    device = next(model.parameters()).device
    tally = Tally(device, split_head=False)
    model.eval()
    with torch.no_grad():
        for batch in range(batches):
            inputs, targets = stream.samples(batch * batch_size, batch_size)
            tally.add(model(inputs.to(device)), targets.to(device))
    return _figures(tally.sums)


def _figures(sums: torch.Tensor) -> dict[str, float]:
    """The pass's figures from this rank's share of the sums (one all-reduce)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)
    loss_sum, hits, tokens = sums.tolist()
    loss = loss_sum / tokens
    return {
        "val_loss": loss,
        "val_perplexity": math.exp(loss) if loss < 700 else math.inf,
        "val_token_accuracy": hits / tokens,
    }
