"""Jobs' outputs in storage named by a URL (`GANGWAY_STORAGE_URL`/outputs: an S3 bucket
or any fsspec filesystem), for hosts that share no disk: what the API lists and serves,
the quota counts and retention deletes, as `scheduler.store.outputs` does for a folder.

Layout (the contract with the rank supervisors, `workers.supervisor.outputs.OutputsUpload`,
which write it): `<root>/job-<id>/rank-<r>/<relative path>`, the folder's layout. An object
store shows an object only once its upload is whole, so there is no partial name to hide;
keys never name a link or a special file. What is shown follows the folder's rules: each
relative path once in the merged view, from the lowest rank that has it; `rank=N` one
rank's files; sorted component by component and paged by the previous page's last path.

Cost: a page lists the job's whole prefix (S3 returns 1,000 keys a request), unlike the
folder's walk that stops at the page's end; a job's total is cached (`StoreUsage`): a
settled job's until it is deleted here, an active job's for `max_age_s`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from fsspec import AbstractFileSystem

from scheduler.store.output_usage import keep_recent
from scheduler.store.outputs import (
    PARTIAL_SUFFIX,
    RANK_PREFIX,
    OutputEntry,
    OutputsSlice,
    Parts,
    first_of_each_path,
)
from workers.stored_files import StoredFolder, modified

log = logging.getLogger("gangway")
_RANK = re.compile(rf"{RANK_PREFIX}(0|[1-9][0-9]{{0,9}})")


@dataclass(frozen=True)
class StoredOutput:
    """A file a download may read, and where."""

    url: str
    entry: OutputEntry
    fs: AbstractFileSystem

    def open(self) -> BinaryIO:
        opened: BinaryIO = self.fs.open(str(self.fs._strip_protocol(self.url)), "rb")
        return opened


def job_outputs_url(root_url: str, job_id: int) -> str:
    """What a job's supervisors upload under (each rank in `rank-<r>`)."""
    return f"{root_url.rstrip('/')}/job-{job_id}"


class RemoteOutputs:
    """Every job's outputs under the root URL `url`."""

    def __init__(
        self, url: str, fs: AbstractFileSystem | None = None, *, usage: StoreUsage | None = None
    ) -> None:
        folder = StoredFolder(url, fs)
        self.url, self.fs, self._path = folder.url, folder.fs, folder.path
        # one per URL and process unless given: the API, the loop and retention share it
        self._usage = usage if usage is not None else shared_usage(self.url)

    def job_url(self, job_id: int) -> str:
        return job_outputs_url(self.url, job_id)

    def job(self, job_id: int) -> StoredFolder:
        """The job's outputs, for retention to delete."""
        return _Forgetting(self.job_url(job_id), self.fs, lambda: self._usage.forget(job_id))

    def listing(
        self, job_id: int, *, rank: int | None = None, after: Parts = (), limit: int = 1000
    ) -> OutputsSlice:
        """Up to `limit` files after the path `after`: the merged view, or rank `rank`'s."""
        by_rank = self._files(job_id)
        chosen = sorted(by_rank) if rank is None else [rank]
        streams = [_after(by_rank.get(r, []), r, after) for r in chosen]
        merged = first_of_each_path(heapq.merge(*streams, key=lambda f: (f[0], f[1])))
        files = [_entry(p, r, info) for p, r, info in itertools.islice(merged, limit + 1)]
        more = len(files) > limit
        files = files[:limit]
        return OutputsSlice(files, files[-1].path if more else None)

    def find(self, job_id: int, parts: Parts, *, rank: int | None = None) -> StoredOutput | None:
        """The file a download of `parts` reads: the lowest rank's in the merged view,
        else rank `rank`'s; None when no listing shows one there."""
        if not all(_shown(part) for part in parts):
            return None
        chosen = self._ranks(job_id) if rank is None else [rank]
        for r in chosen:
            url = f"{self.job_url(job_id)}/{RANK_PREFIX}{r}/{'/'.join(parts)}"
            try:
                info = self.fs.info(self._key(url))
            except FileNotFoundError:
                continue
            if info.get("type") == "file":
                return StoredOutput(url, _entry(parts, r, info), self.fs)
        return None

    def job_bytes(self, job_id: int, *, settled: bool, wait: bool = True) -> int:
        """Bytes the job's outputs hold (cached; see the module docstring). Without
        `wait` (the scheduling loop, which must not wait on the network) a total not
        known yet or gone stale reads as what was known (0 for none) while it is listed
        again in the background."""
        return self._usage.get(job_id, settled, lambda: self._total(job_id), wait=wait)

    # -- listing ----------------------------------------------------------------------

    def _key(self, url: str) -> str:
        return str(self.fs._strip_protocol(url))

    def _ranks(self, job_id: int) -> list[int]:
        try:
            entries = self.fs.ls(self._key(self.job_url(job_id)), detail=False)
        except FileNotFoundError:
            return []
        found = (_RANK.fullmatch(str(name).rstrip("/").rsplit("/", 1)[-1]) for name in entries)
        return sorted(int(m.group(1)) for m in found if m)

    def _files(self, job_id: int) -> dict[int, list[tuple[Parts, dict[str, Any]]]]:
        """Every rank's files, each rank's sorted by path component by component."""
        base = self._key(self.job_url(job_id))
        by_rank: dict[int, list[tuple[Parts, dict[str, Any]]]] = {}
        for key, info in self.fs.find(base, detail=True).items():
            rank_name, _, relative = str(key)[len(base) :].strip("/").partition("/")
            match = _RANK.fullmatch(rank_name)
            parts = tuple(relative.split("/"))
            if match and relative and all(_shown(p) for p in parts):
                by_rank.setdefault(int(match.group(1)), []).append((parts, info))
        for files in by_rank.values():
            files.sort(key=lambda f: f[0])
        return by_rank

    def _total(self, job_id: int) -> int:
        return sum(
            int(info.get("size") or 0)
            for files in self._files(job_id).values()
            for _, info in files
        )


class _Forgetting(StoredFolder):
    """A job's outputs whose cached total is dropped once they are deleted."""

    def __init__(self, url: str, fs: AbstractFileSystem, forget: Callable[[], None]) -> None:
        super().__init__(url, fs)
        self._forget = forget

    def delete(self) -> bool:
        try:
            return super().delete()
        finally:
            self._forget()


class StoreUsage:
    """Job id -> (bytes, when listed, settled then): a settled job's total trusted until
    `forget`, an active job's for `max_age_s`; least recently used out past `max_jobs`.
    Thread-safe. Totals asked for without waiting are listed by one daemon thread of its
    own (started again if it ever dies), each job once however often it is asked for
    meanwhile. A listing that began before a `forget` keeps nothing (each job's
    generation moves on `forget`): it may have counted files deleted since."""

    def __init__(
        self,
        *,
        max_age_s: float = 30.0,
        max_jobs: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_age_s, self._max_jobs, self._clock = max_age_s, max_jobs, clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[int, float, bool]] = OrderedDict()
        self._pending: set[int] = set()
        self._forgotten: dict[int, int] = {}  # job id -> times forgotten (its generation)
        self._refresh: queue.SimpleQueue[tuple[int, bool, Callable[[], int]]] = queue.SimpleQueue()
        self._lister_thread: threading.Thread | None = None

    def get(
        self, job_id: int, settled: bool, total: Callable[[], int], *, wait: bool = True
    ) -> int:
        now = self._clock()
        with self._lock:
            cached = self._entries.get(job_id)
            if cached is not None and (cached[2] or now - cached[1] < self._max_age_s):
                self._entries.move_to_end(job_id)
                return cached[0]
            if not wait:
                self._list_later(job_id, settled, total)
                return cached[0] if cached is not None else 0
        return self._listed(job_id, settled, total)

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._entries.pop(job_id, None)
            self._forgotten[job_id] = self._forgotten.get(job_id, 0) + 1

    def _listed(self, job_id: int, settled: bool, total: Callable[[], int]) -> int:
        with self._lock:
            generation = self._forgotten.get(job_id, 0)
        now, value = self._clock(), total()
        with self._lock:
            if self._forgotten.get(job_id, 0) != generation:
                return value  # deleted meanwhile: the next ask lists it again
            keep_recent(self._entries, job_id, (value, now, settled), self._max_jobs)
        return value

    def _list_later(self, job_id: int, settled: bool, total: Callable[[], int]) -> None:
        """(Holding the lock.) Queue a listing unless one is queued for the job."""
        if job_id in self._pending:
            return
        self._pending.add(job_id)
        self._refresh.put((job_id, settled, total))
        if self._lister_thread is None or not self._lister_thread.is_alive():
            self._lister_thread = threading.Thread(
                target=self._lister, name="gangway-usage", daemon=True
            )
            self._lister_thread.start()

    def _lister(self) -> None:
        while True:
            job_id, settled, total = self._refresh.get()
            try:
                self._listed(job_id, settled, total)
            except BaseException:  # the store, the network: asked again at the next launch
                log.warning("outputs of job %d could not be counted", job_id, exc_info=True)
            finally:
                with self._lock:
                    self._pending.discard(job_id)


_SHARED: dict[str, StoreUsage] = {}
_SHARED_LOCK = threading.Lock()


def shared_usage(url: str) -> StoreUsage:
    """The process's cache for the store at `url`."""
    with _SHARED_LOCK:
        return _SHARED.setdefault(url, StoreUsage())


def _after(
    files: list[tuple[Parts, dict[str, Any]]], rank: int, after: Parts
) -> Iterator[tuple[Parts, int, dict[str, Any]]]:
    for parts, info in files:
        if parts > after:
            yield parts, rank, info


def _shown(name: str) -> bool:
    """What a listing shows and a download may name: never a partial name, nor one S3
    would cut at `?versionId=` (asking for `x?versionId=1` would read `x`)."""
    return bool(name) and not name.endswith(PARTIAL_SUFFIX) and "?versionId=" not in name


def _entry(parts: Parts, rank: int, info: dict[str, Any]) -> OutputEntry:
    return OutputEntry(
        path="/".join(parts),
        bytes=int(info.get("size") or 0),
        rank=rank,
        modified_at=modified(info),
    )
