"""Checkpoints written before the head was cut into vocabulary slices.

Until 2026-12-02 the model's head was one `head.weight` (vocabulary x n_embd); it is now
`head.0.weight` ... `head.3.weight` (`workers.gpt.vocabulary_slices`), so a pipeline
stage can hold some of them. A job checkpointed by the older release must still resume:
where the checkpoint lacks a slice's entries (the parameter, its optimizer moments and
step, its parameter-group settings) but holds the whole head's, the whole entry is read
and each slice takes its rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from workers.gpt import vocabulary_slices

_SLICE = re.compile(r"(?<![^.])head\.(\d+)\.weight(?![^.])")
SECTIONS = ("model", "optim")


def read_whole_head(state: dict[str, Any], saved: Mapping[str, Any]) -> Callable[[], None]:
    """Swap the head slices' entries that `saved` (a checkpoint's metadata) lacks, in the
    merged state DCP loads, for the whole head's entries it has; the returned function,
    called after the load, copies each slice its rows (into the parts' own state dicts,
    which the merged one only gathers) and drops the whole entries again."""
    fills: list[tuple[dict[str, Any], Any, str, int]] = []
    for section in SECTIONS:
        entries = state[section]
        for key in list(entries):
            match = _SLICE.search(key)
            if match is None or f"{section}.{key}" in saved:
                continue
            old = _SLICE.sub("head.weight", key)
            meta = saved.get(f"{section}.{old}")
            if meta is None:
                continue
            slot = entries.pop(key)  # the part's own state dict keeps it, to fill below
            if old not in entries:
                entries[old] = _placeholder(slot, meta)
            fills.append((entries, slot, old, int(match.group(1))))

    def hand_out() -> None:
        for entries, slot, old, piece in fills:
            _copy_rows(entries[old], slot, piece)
        for entries, _slot, old, _piece in fills:
            entries.pop(old, None)

    return hand_out


def _placeholder(like: Any, meta: Any) -> Any:
    """What DCP loads the whole entry into: a full tensor on the slice's device, or the
    slice's own value for a parameter-group setting (the optimizer's, as at any load)."""
    if not isinstance(meta, TensorStorageMetadata):
        return like
    device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
    return torch.empty(meta.size, dtype=meta.properties.dtype, device=device)


def _copy_rows(whole: Any, slot: Any, piece: int) -> None:
    """Fill `slot` (the slice's tensor in the model's or optimizer's own state dict, a
    DTensor when sharded) in place with its rows of the whole entry; a scalar (AdamW's
    step) is the same for every slice."""
    if not isinstance(slot, torch.Tensor):
        return
    if whole.dim() == 0:
        slot.copy_(whole)
        return
    rows = vocabulary_slices(whole.shape[0])[piece]
    part = whole[rows.start : rows.stop].to(slot.dtype)
    if isinstance(slot, DTensor):
        local = distribute_tensor(part, slot.device_mesh, slot.placements, src_data_rank=None)
        slot.to_local().copy_(local.to_local())
    else:
        slot.copy_(part)
