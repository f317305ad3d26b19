"""Distributed checkpoints with `torch.distributed.checkpoint` (DCP).

Model and optimizer state are saved by parameter name (optimizer state flattened to
`state.<fqn>.<key>`), as DCP's sharded tensors: a checkpoint written by FSDP at dp=4 loads
at dp=2, and a pipeline stage finds its layers by name whatever the pipeline degree was.
The trainer state is the step plus named counters (the built-in trainer keeps its data
position, the next sample index, there: with an elastic job the global batch changes with
dp, so the position no longer follows from the step). Nothing is random after init, so
there is no RNG to restore.

Layout and completeness: `workers.checkpoint_layout`. The newest `keep_last` are kept.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gangway.models import CheckpointPolicy, wire_default
from workers import faults
from workers.checkpoint_layout import (
    PARTIAL,
    checkpoint_path,
    completed,
    is_complete,
    partial_path,
    step_of,
)
from workers.engine.checkpoint_compat import read_older_layouts

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class Checkpointer:
    """Saves and restores this rank's model parts and optimizers (one per part). With no
    directory it does nothing: a job without checkpoints."""

    def __init__(
        self,
        directory: Path | None,
        parts: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer],
        keep_last: int = wire_default(CheckpointPolicy, "keep_last"),
        extra: dict[str, torch.Tensor] | None = None,
        *,
        own_directory: bool = False,
    ) -> None:
        """`own_directory`: the directory is this rank's alone (a host's disk, its
        supervisor copying each finished `step-*` to and from the job's store), not one
        every rank shares: each rank then renames its own save into place and keeps no
        old ones (its supervisor removes what it uploaded)."""
        self.directory, self.parts, self.optimizers = directory, parts, optimizers
        self.own_directory = own_directory
        self._step: int | None = None  # the step this process last saved or loaded
        self._loaded_once = False
        # Replicated tensors of the trainer's own (an outer optimizer's momentum), saved
        # by name and loaded in place when the checkpoint has them.
        self.extra = extra or {}
        self.keep_last = max(1, keep_last)
        self.counters: dict[str, int] = {}  # what the newest load restored besides the step

    def save(self, step: int, **counters: int) -> Path | None:
        """Save at `step`, with integer `counters` the caller wants back on resume.

        A complete checkpoint at `step` is kept as it is (a job stopped right after it
        resumed has nothing new to save). Otherwise every rank writes into the partial
        directory and rank 0 renames it once all have: a kill at any moment leaves either
        no new checkpoint or a whole one (see workers.checkpoint_layout)."""
        if self.directory is None:
            return None
        final = checkpoint_path(self.directory, step)
        if step == self._step or (not self.own_directory and is_complete(final)):
            return final
        partial = partial_path(self.directory, step)
        renames = is_rank0() or self.own_directory  # every rank agrees on the branches
        if renames:
            shutil.rmtree(partial, ignore_errors=True)  # a save killed at this step before
        _barrier()
        models, optims = self._state_dicts()
        state = _merged(models, optims, step, counters) | {"extra": self.extra}
        faults.inject("checkpoint.save")
        with _single_process_is_intended():
            state_dict_saver.save(state, checkpoint_id=str(partial), no_dist=_single_process())
        faults.inject("checkpoint.saved")  # written, not yet renamed or pruned
        _barrier()
        if renames:
            shutil.rmtree(final, ignore_errors=True)  # never complete: junk from an old crash
            partial.rename(final)
            if not self.own_directory:
                _prune(self.directory, self.keep_last)
        _barrier()
        self._step = step
        return final

    def load_latest(self, *counters: str) -> int:
        """Restore the newest complete checkpoint; the step it was taken at (0: none).
        The named `counters` it holds land in `self.counters` (absent ones stay out).
        In its own directory, only the first call restores (what the supervisor fetched
        before the start); a later one (a rollback) finds none, on every rank alike."""
        self.counters = {}
        if self.directory is None or (self.own_directory and self._loaded_once):
            return 0  # in its own directory a rank holds only its shards of a later save
        self._loaded_once = True
        done = completed(self.directory)
        if self.own_directory:
            _same_on_every_rank(step_of(done[-1]) if done else 0)
        if not done:
            return 0
        models, optims = self._state_dicts()
        saved = MetadataReader(done[-1]).read_metadata().state_dict_metadata
        held = [name for name in counters if f"trainer.{name}" in saved]
        state = _merged(models, optims, 0, dict.fromkeys(held, 0))
        state["extra"] = dict(self.extra)  # what the checkpoint lacks keeps its value
        _load(state, done[-1], saved)
        for part, optimizer, model_sd, optim_sd in zip(
            self.parts, self.optimizers, models, optims, strict=True
        ):
            set_model_state_dict(part, model_sd)
            set_optimizer_state_dict(part, optimizer, optim_sd, options=FLAT)
        trainer = {key: int(value.item()) for key, value in state["trainer"].items()}
        self.counters = {k: v for k, v in trainer.items() if k != "step"}
        self._step = trainer["step"]
        return trainer["step"]

    def load_weights(self, checkpoint: Path) -> None:
        """Only the model's parameters from `checkpoint` (a registered model version: a
        checkpoint of another job, at any dp/tp/pp), not its optimizer state or counters:
        the job trains on from those weights with its own optimizer and schedule."""
        models = [get_model_state_dict(part) for part in self.parts]
        state = _merged(models, [{} for _ in models], 0, {})
        del state["trainer"]
        state["extra"] = {}
        saved = MetadataReader(checkpoint).read_metadata().state_dict_metadata
        _load(state, checkpoint, saved)
        for part, model_sd in zip(self.parts, models, strict=True):
            set_model_state_dict(part, model_sd)

    def _state_dicts(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        models = [get_model_state_dict(part) for part in self.parts]
        optims = [
            get_optimizer_state_dict(part, opt, options=FLAT)
            for part, opt in zip(self.parts, self.optimizers, strict=True)
        ]
        return models, optims


def _same_on_every_rank(step: int) -> None:
    """Ranks that each fetched their checkpoint (own directories) must have fetched the
    same one: a rank that loads while another does not would wait on it for ever. A
    disagreement (an upload that landed between two supervisors' looks) fails the gang,
    and the next attempt looks again."""
    if _single_process():
        return
    steps = torch.tensor([step, -step], dtype=torch.int64)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    newest, oldest = int(steps[0]), -int(steps[1])
    if newest != oldest:
        raise RuntimeError(
            f"the ranks were given different checkpoints to resume from (steps {oldest} "
            f"to {newest}): the store changed while they fetched; this attempt ends"
        )


def _prune(directory: Path, keep_last: int) -> None:
    """Keep the newest `keep_last`; drop partial saves of earlier, killed attempts."""
    for old in completed(directory)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in directory.glob(f"{PARTIAL}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _merged(
    models: list[dict[str, Any]],
    optims: list[dict[str, Any]],
    step: int,
    counters: dict[str, int],
) -> dict[str, Any]:
    """One state dict over all parts: names are the full model's, so they never clash."""
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for model_sd, optim_sd in zip(models, optims, strict=True):
        model.update(model_sd)
        optim.update(optim_sd)
    trainer = {"step": step, **counters}
    return {
        "model": model,
        "optim": optim,
        "trainer": {key: torch.tensor(value) for key, value in trainer.items()},
    }


def _load(state: dict[str, Any], checkpoint: Path, saved: Mapping[str, Any]) -> None:
    """Fill `state`'s tensors in place from `checkpoint` (whose metadata is `saved`),
    reading the layouts of older releases too."""
    hand_out_head = read_older_layouts(state, saved)
    _only_tensors(state["model"], saved)
    with _single_process_is_intended():  # DCP fills the tensors of every dict in place
        state_dict_loader.load(
            state, storage_reader=MetadataReader(checkpoint), no_dist=_single_process()
        )
    hand_out_head()


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` is a pickle: read as it is, a checkpoint could run code in
    whoever loads it (a reader's job started from a shared model version). Only the
    classes a DCP metadata file holds may be named in it."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module == "torch.distributed.checkpoint.metadata"
            or (module, name) in _METADATA_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"checkpoint metadata may not name {module}.{name}")
        return super().find_class(module, name)


_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class MetadataReader(FileSystemReader):
    """`FileSystemReader` whose metadata is read by `_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError("checkpoint metadata is not DCP's Metadata")
        storage = metadata.storage_meta or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


def _only_tensors(model: dict[str, Any], saved: Mapping[str, Any]) -> None:
    """Every model entry to load is a tensor in the checkpoint: DCP reads an entry saved
    as bytes with `torch.load(weights_only=False)`, which runs whatever it holds."""
    for key in model:
        if not isinstance(saved.get(f"model.{key}"), TensorStorageMetadata | type(None)):
            raise ValueError(f"the checkpoint holds model.{key} as bytes, not as a tensor")


def _single_process() -> bool:
    """No process group (a one-rank function entrypoint, a test): DCP saves locally."""
    return not dist.is_initialized()


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """DCP warns whenever it runs without a process group, even when told to."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def is_rank0() -> bool:
    """Rank 0 of the default process group, or the only process when there is none."""
    return not dist.is_initialized() or dist.get_rank() == 0


def stop_agreed(local: bool) -> bool:
    """True on every rank if any rank was asked to stop. A notice reaches the ranks at
    different moments; a rank that left the loop alone would wait in the checkpoint's
    collectives while its peers wait in the next step's, until the deadline kills them.
    One one-element all-reduce per call (the trainer calls it once a step)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    flag = torch.tensor([int(local)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
