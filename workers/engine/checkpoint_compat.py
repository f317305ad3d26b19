"""Checkpoints written by earlier releases, read by this one.

Three layouts changed on 2026-12-02, so a pipeline stage can hold part of a parameter.
The head was one `head.weight` (vocabulary x n_embd); it is now `head.0.weight` ...
`head.3.weight` (`workers.engine.gpt.vocabulary_slices`). Later that day each block's MLP,
one `mlp.fc` and one `mlp.proj`, became `mlp.fc.<c>` (fc's rows: the hidden width's
slice c) and `mlp.proj.<c>` (proj's columns), `mlp.proj.0` with the bias
(`workers.engine.gpt.mlp_slices`). And DiLoCo's outer momentum, saved beside the model, was
keyed by the parameter's position (`outer_momentum.<i>`, counting the whole head and
each whole fc and proj once); it is now keyed by the parameter's name. A job
checkpointed by an older release must still resume: where the checkpoint lacks a
slice's entries (the parameter, its optimizer moments and step, its parameter-group
settings, its outer momentum) but holds the whole parameter's, the whole entry is read
and each slice takes its part; an outer momentum keyed by position is read under that
key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from workers.engine.gpt import mlp_slices, vocabulary_slices


@dataclass(frozen=True)
class _Sliced:
    """A parameter now kept in slices: the slice's name (its index the first group),
    the whole parameter's name in older checkpoints, and a slice's part of the whole."""

    pattern: re.Pattern[str]
    whole: str
    part: Callable[[torch.Tensor, int], torch.Tensor]

    def whole_key(self, key: str) -> str:
        return self.pattern.sub(lambda m: m.expand(self.whole), key)


def _component(name: str) -> re.Pattern[str]:
    """`name` as whole dot-separated components of a key."""
    return re.compile(rf"(?<![^.]){name}(?![^.])")


def _rows(slices: Callable[[int], list[range]]) -> Callable[[torch.Tensor, int], torch.Tensor]:
    def part(whole: torch.Tensor, index: int) -> torch.Tensor:
        rows = slices(whole.shape[0])[index]
        return whole[rows.start : rows.stop]

    return part


def _proj_columns(whole: torch.Tensor, index: int) -> torch.Tensor:
    columns = mlp_slices(whole.shape[1])[index]
    return whole[:, columns.start : columns.stop]


_SLICED = (
    _Sliced(_component(r"head\.(\d+)\.weight"), "head.weight", _rows(vocabulary_slices)),
    _Sliced(_component(r"mlp\.fc\.(\d+)\.(weight|bias)"), r"mlp.fc.\2", _rows(mlp_slices)),
    _Sliced(_component(r"mlp\.proj\.(\d+)\.weight"), "mlp.proj.weight", _proj_columns),
    _Sliced(_component(r"mlp\.proj\.(0)\.bias"), "mlp.proj.bias", lambda whole, _: whole),
)
# A slot to fill after the load: its entries, the slice's tensor, the whole entry's key,
# how a slice's part is taken, the slice's index.
_Fill = tuple[dict[str, Any], Any, str, _Sliced, int]


def read_older_layouts(state: dict[str, Any], saved: Mapping[str, Any]) -> Callable[[], None]:
    """Rekey `state` (the merged model, optim and extra dicts DCP loads) to what `saved`
    (the checkpoint's metadata) holds: slices it lacks become the whole parameter's entry,
    extra tensors it lacks by name take their old positional key, and extras it lacks
    altogether are left out (they keep their value). The returned function, called after
    the load, copies each slice its part (into the parts' own state dicts, which the
    merged one only gathers) and drops the whole entries again."""
    fills: list[_Fill] = []
    for section in ("model", "optim"):
        _swap_slices(state[section], section, saved, _whole_key, fills)
    extra = state["extra"]
    positions = _positions(list(extra))

    def extra_whole_key(key: str) -> str | None:
        named = _whole_key(key)
        return named if f"extra.{named}" in saved else positions.get(key)

    _swap_slices(extra, "extra", saved, extra_whole_key, fills)
    for key in list(extra):
        old = positions.get(key)
        if f"extra.{key}" in saved:
            continue
        if old is not None and f"extra.{old}" in saved:
            extra[old] = extra.pop(key)  # DCP fills the same tensor under its old key
        else:
            del extra[key]

    def hand_out() -> None:
        for entries, slot, old, sliced, index in fills:
            _copy_part(entries[old], slot, sliced, index)
        for entries, _slot, old, _sliced, _index in fills:
            entries.pop(old, None)

    return hand_out


def _sliced(key: str) -> tuple[_Sliced, int] | None:
    for sliced in _SLICED:
        match = sliced.pattern.search(key)
        if match is not None:
            return sliced, int(match.group(1))
    return None


def _whole_key(key: str) -> str:
    """The key with every sliced parameter's name replaced by its whole one's."""
    for sliced in _SLICED:
        key = sliced.whole_key(key)
    return key


def _swap_slices(
    entries: dict[str, Any],
    section: str,
    saved: Mapping[str, Any],
    whole_key: Callable[[str], str | None],
    fills: list[_Fill],
) -> None:
    """Replace the slices' entries `saved` lacks by the whole parameter's entry it has."""
    for key in list(entries):
        found = _sliced(key)
        if found is None or f"{section}.{key}" in saved:
            continue
        old = whole_key(key)
        meta = None if old is None else saved.get(f"{section}.{old}")
        if old is None or meta is None:
            continue
        slot = entries.pop(key)  # the part's own state dict keeps it, to fill below
        if old not in entries:
            entries[old] = _placeholder(slot, meta)
        fills.append((entries, slot, old, *found))


def _positions(keys: list[str]) -> dict[str, str]:
    """Each `<prefix>.<parameter name>` key's old positional key `<prefix>.<i>`: the
    parameters in order, the slices of one parameter counted as the one it was."""
    positions: dict[str, str] = {}
    seen: dict[str, dict[str, int]] = {}
    for key in keys:
        prefix, _, name = key.partition(".")
        olds = seen.setdefault(prefix, {})
        index = olds.setdefault(_whole_key(name), len(olds))
        positions[key] = f"{prefix}.{index}"
    return positions


def _placeholder(like: Any, meta: Any) -> Any:
    """What DCP loads the whole entry into: a full tensor on the slice's device, or the
    slice's own value for a parameter-group setting (the optimizer's, as at any load)."""
    if not isinstance(meta, TensorStorageMetadata):
        return like
    device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
    return torch.empty(meta.size, dtype=meta.properties.dtype, device=device)


def _copy_part(whole: Any, slot: Any, sliced: _Sliced, index: int) -> None:
    """Fill `slot` (the slice's tensor in the model's or optimizer's own state dict, a
    DTensor when sharded) in place with its part of the whole entry; a scalar (AdamW's
    step) is the same for every slice."""
    if not isinstance(slot, torch.Tensor):
        return
    if whole.dim() == 0:
        slot.copy_(whole)
        return
    part = sliced.part(whole, index).contiguous().to(slot.dtype)
    if isinstance(slot, DTensor):
        local = distribute_tensor(part, slot.device_mesh, slot.placements, src_data_rank=None)
        slot.to_local().copy_(local.to_local())
    else:
        slot.copy_(part)
