"""Checkpoints written by releases before 2026-12-02, read by this one.

Two things changed then. The model's head was one `head.weight` (vocabulary x n_embd);
it is now `head.0.weight` ... `head.3.weight` (`workers.gpt.vocabulary_slices`), so a
pipeline stage can hold some of them. And DiLoCo's outer momentum, saved beside the
model, was keyed by the parameter's position (`outer_momentum.<i>`, the head one entry,
last); it is now keyed by the parameter's name. A job checkpointed by the older release
must still resume: where the checkpoint lacks a slice's entries (the parameter, its
optimizer moments and step, its parameter-group settings, its outer momentum) but holds
the whole head's, the whole entry is read and each slice takes its rows; an outer
momentum keyed by position is read under that key.
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
# A slot to fill after the load: its entries, the slice's tensor, the whole entry's key,
# the slice's index.
_Fill = tuple[dict[str, Any], Any, str, int]


def read_older_layouts(state: dict[str, Any], saved: Mapping[str, Any]) -> Callable[[], None]:
    """Rekey `state` (the merged model, optim and extra dicts DCP loads) to what `saved`
    (the checkpoint's metadata) holds: head slices it lacks become the whole head's entry,
    extra tensors it lacks by name take their old positional key, and extras it lacks
    altogether are left out (they keep their value). The returned function, called after
    the load, copies each slice its rows (into the parts' own state dicts, which the
    merged one only gathers) and drops the whole entries again."""
    fills: list[_Fill] = []
    for section in ("model", "optim"):
        _swap_slices(state[section], section, saved, _whole_head_key, fills)
    extra = state["extra"]
    positions = _positions(list(extra))
    _swap_slices(extra, "extra", saved, positions.get, fills)
    for key in list(extra):
        old = positions.get(key)
        if f"extra.{key}" in saved:
            continue
        if old is not None and f"extra.{old}" in saved:
            extra[old] = extra.pop(key)  # DCP fills the same tensor under its old key
        else:
            del extra[key]

    def hand_out() -> None:
        for entries, slot, old, piece in fills:
            _copy_rows(entries[old], slot, piece)
        for entries, _slot, old, _piece in fills:
            entries.pop(old, None)

    return hand_out


def _whole_head_key(key: str) -> str:
    return _SLICE.sub("head.weight", key)


def _swap_slices(
    entries: dict[str, Any],
    section: str,
    saved: Mapping[str, Any],
    whole_key: Callable[[str], str | None],
    fills: list[_Fill],
) -> None:
    """Replace the head slices' entries `saved` lacks by the whole head's entry it has."""
    for key in list(entries):
        match = _SLICE.search(key)
        if match is None or f"{section}.{key}" in saved:
            continue
        old = whole_key(key)
        meta = None if old is None else saved.get(f"{section}.{old}")
        if old is None or meta is None:
            continue
        slot = entries.pop(key)  # the part's own state dict keeps it, to fill below
        if old not in entries:
            entries[old] = _placeholder(slot, meta)
        fills.append((entries, slot, old, int(match.group(1))))


def _positions(keys: list[str]) -> dict[str, str]:
    """Each `<prefix>.<parameter name>` key's old positional key `<prefix>.<i>`: the
    parameters in order, the head's slices counted as the one head they were."""
    positions: dict[str, str] = {}
    following: dict[str, int] = {}
    for key in keys:
        prefix, _, name = key.partition(".")
        index = following.get(prefix, 0)
        match = _SLICE.fullmatch(name)
        if match is not None and int(match.group(1)) > 0:
            index -= 1  # a later slice: the same position as the first
        positions[key] = f"{prefix}.{index}"
        following[prefix] = index + 1
    return positions


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
