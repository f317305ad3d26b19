"""Where jobs' outputs are kept, as one interface for the API, the launch quota and
retention: a folder (`LocalOutputs`: the embedded default, or a mount every host shares)
or storage named by a URL (`scheduler.store.remote_outputs.RemoteOutputs`: hosts that
share no disk). Both lay files out as `job-<id>/rank-<r>/<path>` and show them alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from scheduler.store.output_usage import USAGE, UsageCache
from scheduler.store.outputs import (
    FoundOutput,
    OutputsSlice,
    Parts,
    find_output,
    list_outputs,
)
from scheduler.store.remote_outputs import RemoteOutputs, StoredOutput


class OutputsStorage(Protocol):
    def listing(
        self, job_id: int, *, rank: int | None = None, after: Parts = (), limit: int = 1000
    ) -> OutputsSlice: ...

    def find(
        self, job_id: int, parts: Parts, *, rank: int | None = None
    ) -> FoundOutput | StoredOutput | None: ...

    def job_bytes(self, job_id: int, *, settled: bool, wait: bool = True) -> int: ...


class LocalOutputs:
    """Every job's outputs in the folder `root` (`scheduler.store.outputs`); totals
    cached by `cache` (one per process by default, shared by the API and the loop)."""

    def __init__(self, root: Path, cache: UsageCache = USAGE) -> None:
        self.root, self._cache = root, cache

    def listing(
        self, job_id: int, *, rank: int | None = None, after: Parts = (), limit: int = 1000
    ) -> OutputsSlice:
        return list_outputs(self.root, job_id, rank=rank, after=after, limit=limit)

    def find(self, job_id: int, parts: Parts, *, rank: int | None = None) -> FoundOutput | None:
        return find_output(self.root, job_id, parts, rank=rank)

    def job_bytes(self, job_id: int, *, settled: bool, wait: bool = True) -> int:
        """(A local walk: `wait` changes nothing.)"""
        return self._cache.job_bytes(self.root, job_id, settled=settled)


def outputs_storage(root: Path | None, store: RemoteOutputs | None) -> OutputsStorage | None:
    """The store when one is named, else the folder (None: no outputs kept)."""
    if store is not None:
        return store
    return LocalOutputs(root) if root is not None else None
