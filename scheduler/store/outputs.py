"""Jobs' outputs on the service's storage: where they live, what a listing shows, which
file a download reads.

Layout (the storage contract with the rank supervisor, which writes it):
`<root>/job-<id>/rank-<r>/<relative path>`, each rank under its own folder, so no two
supervisors write one file. A file being copied is written as `<name>.gangway-partial`
beside its final name and renamed when complete. The supervisor creates no symlinks.

What is shown: regular files only, never a `*.gangway-partial` entry (a copy in
progress), never a symlink or anything under one (not followed, not served), nor a name
that is not UTF-8 (it could not be asked for). The merged view shows each relative path
once, from the lowest rank that has it (torchrun-style scripts save from rank 0, so rank
0's copy wins); `rank=N` shows one rank's files.

Why here, in the store, and standard library only: the API lists and serves these files
and the scheduler runtime counts them at launch (`output_usage`); both import the store,
neither may need Ray or torch. `workers/` imports nothing from `scheduler`, so the runtime
hands each rank's supervisor its folder (`rank_outputs_dir`) and `PARTIAL_SUFFIX` when it
launches the gang, as it hands the ranks their checkpoint directory. Like packages.py,
this part of the store keeps files, not rows.

Listings are sorted by path component by component (a folder's files stay together) and
paged by a cursor, the last path of the previous page: a page walks only the folders at
or after the cursor and stats only the files it returns, so a job that wrote 100,000
files is listed a page at a time without ever holding them all.
"""

from __future__ import annotations

import heapq
import itertools
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

PARTIAL_SUFFIX = ".gangway-partial"
RANK_PREFIX = "rank-"
_RANK = re.compile(r"rank-(0|[1-9][0-9]{0,9})")

Parts = tuple[str, ...]
Info = TypeVar("Info")  # what a listing knows of a file: a stat, or a store's listing entry


@dataclass(frozen=True)
class OutputEntry:
    path: str  # '/'-separated, relative to the rank's folder
    bytes: int
    rank: int
    modified_at: datetime


@dataclass(frozen=True)
class OutputsSlice:
    """One page of a listing; `next_cursor` (the last path here) when more follow."""

    files: list[OutputEntry]
    next_cursor: str | None


@dataclass(frozen=True)
class FoundOutput:
    """A file a download may read: a regular file reached through real directories."""

    path: Path
    entry: OutputEntry
    stat: os.stat_result


def job_outputs_dir(root: Path, job_id: int) -> Path:
    return root / f"job-{job_id}"


def rank_outputs_dir(root: Path, job_id: int, rank: int) -> Path:
    """Where rank `rank`'s supervisor copies what the rank wrote to its OUTPUTS_DIR."""
    return job_outputs_dir(root, job_id) / f"{RANK_PREFIX}{rank}"


def ranks(root: Path, job_id: int) -> list[int]:
    """The ranks that have a folder (a real one, not a symlink), lowest first."""
    directory = job_outputs_dir(root, job_id)
    if not _is_real_dir_path(directory):
        return []
    found = []
    for entry in _entries(directory):
        match = _RANK.fullmatch(entry.name)
        if match is not None and _is_real_dir(entry):
            found.append(int(match.group(1)))
    return sorted(found)


def list_outputs(
    root: Path,
    job_id: int,
    *,
    rank: int | None = None,
    after: Parts = (),
    limit: int = 1000,
) -> OutputsSlice:
    """Up to `limit` files after the path `after` (empty: from the start): the merged
    view, or rank `rank`'s files."""
    chosen = ranks(root, job_id) if rank is None else [rank]
    streams = [_rank_files(root, job_id, r, after) for r in chosen]
    merged = first_of_each_path(heapq.merge(*streams, key=lambda f: (f[0], f[1])))
    files = [_entry(parts, r, st) for parts, r, st in itertools.islice(merged, limit + 1)]
    more = len(files) > limit
    files = files[:limit]
    return OutputsSlice(files, files[-1].path if more else None)


def find_output(
    root: Path, job_id: int, parts: Parts, *, rank: int | None = None
) -> FoundOutput | None:
    """The file a download of `parts` reads: in the merged view the lowest rank's that a
    listing shows, else rank `rank`'s; None when no listing shows one there."""
    for r in ranks(root, job_id) if rank is None else [rank]:
        found = _regular_file(rank_outputs_dir(root, job_id, r), parts)
        if found is not None:
            path, st = found
            return FoundOutput(path, _entry(parts, r, st), st)
    return None


def job_bytes(root: Path, job_id: int) -> int:
    """Bytes the job's folder holds: every rank's regular files, copies in progress
    included (they take the space too); symlinks are not followed. Walks the whole
    folder: `output_usage.UsageCache` keeps the answer."""
    return sum(_tree_bytes(rank_outputs_dir(root, job_id, r)) for r in ranks(root, job_id))


# -- walking ----------------------------------------------------------------------------


def _rank_files(
    root: Path, job_id: int, rank: int, after: Parts
) -> Iterator[tuple[Parts, int, os.stat_result]]:
    base = rank_outputs_dir(root, job_id, rank)
    if _is_real_dir_path(base.parent) and _is_real_dir_path(base):
        for parts, st in _files(base, after):
            yield parts, rank, st


def _files(base: Path, after: Parts) -> Iterator[tuple[Parts, os.stat_result]]:
    """Regular files under `base` in component order, from the first one past `after`
    (empty: all). A folder before the cursor is never opened, and a file is stat'ed only
    when reached. Depth-first with a stack of its own: a user's folders may nest deeper
    than Python's recursion limit."""
    # Per open folder: its entries still to visit, its path parts, the cursor below it.
    stack: list[tuple[Iterator[os.DirEntry[str]], Parts, Parts]] = [(_sorted(base), (), after)]
    while stack:
        entries, prefix, bound = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        name = entry.name
        if (bound and name < bound[0]) or not _shown(name):
            continue
        on_cursor = bool(bound) and name == bound[0]
        if _is_real_dir(entry):
            below = bound[1:] if on_cursor else ()
            stack.append((_sorted(Path(entry.path)), (*prefix, name), below))
        elif not on_cursor and _is_regular(entry):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the folder was read
            yield (*prefix, name), st


def first_of_each_path(
    files: Iterable[tuple[Parts, int, Info]],
) -> Iterator[tuple[Parts, int, Info]]:
    """Files merged in (path, rank) order -> each path once, from its lowest rank."""
    previous: Parts | None = None
    for item in files:
        if item[0] != previous:
            previous = item[0]
            yield item


def _tree_bytes(base: Path) -> int:
    """Bytes of the regular files under `base`, any depth, no symlink followed."""
    total, folders = 0, [base]
    while folders:
        for entry in _entries(folders.pop()):
            if _is_real_dir(entry):
                folders.append(Path(entry.path))
            elif _is_regular(entry):
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def _regular_file(base: Path, parts: Parts) -> tuple[Path, os.stat_result] | None:
    """`base/parts` when the job's folder, `base` and every folder on the way are real
    directories (lstat: no symlink is followed) and it is a regular file a listing shows."""
    if not all(_shown(part) for part in parts):
        return None
    if not (_is_real_dir_path(base.parent) and _is_real_dir_path(base)):
        return None
    current = base
    for name in parts[:-1]:
        current = current / name
        if not _is_real_dir_path(current):
            return None
    target = current / parts[-1]
    try:
        st = target.lstat()
    except OSError:  # missing, or a name the file system refuses
        return None
    return (target, st) if stat.S_ISREG(st.st_mode) else None


def _sorted(directory: Path) -> Iterator[os.DirEntry[str]]:
    return iter(sorted(_entries(directory), key=lambda e: e.name))


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """A folder's entries; none when it is missing, not a folder, or unreadable."""
    try:
        with os.scandir(directory) as found:
            return list(found)
    except OSError:
        return []


def _shown(name: str) -> bool:
    if name.endswith(PARTIAL_SUFFIX):
        return False
    try:
        name.encode()
    except UnicodeEncodeError:  # not UTF-8 on disk: no request could name it
        return False
    return True


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def _is_real_dir_path(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _entry(parts: Parts, rank: int, st: os.stat_result) -> OutputEntry:
    return OutputEntry(
        path="/".join(parts),
        bytes=st.st_size,
        rank=rank,
        modified_at=datetime.fromtimestamp(st.st_mtime, UTC),
    )
