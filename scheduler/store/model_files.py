"""A model version's files: copied once out of a job's checkpoint, checked on every read.

`<models root>/<model>/v<N>/` holds a copy of the checkpoint directory the version was
made from (DCP shards and `.metadata`). The checkpoint was written by a rank program,
which is untrusted and may still be running: the copy walks it by descriptor, never
following a link (a link planted in a checkpoint, or swapped in while it is copied,
copies nothing of the service's), opens files without blocking (a FIFO is skipped, never
waited on) and copies regular files only, within a byte budget (the owner's quota). The
copy is written into a fresh temporary folder and renamed when complete, so a version's
folder is never half-written and two registrations never share one. Every file's SHA-256
is taken while copying and kept in the version's row; `verified` recomputes it before a
file is served, and a file whose bytes changed (or that is gone) is refused, never sent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import BinaryIO, Protocol

from scheduler.store.registry import FileDigest, QuotaExceeded

_CHUNK = 1 << 20
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class TamperedFile(Exception):
    """A version's file no longer has the bytes it was registered with."""


def version_directory(root: Path, model: str, version: int) -> Path:
    return root / model / f"v{version}"


def copy_checkpoint(source: Path, target: Path, *, max_bytes: int) -> tuple[FileDigest, ...]:
    """Copy the regular files under `source` to `target` (which must not exist), at most
    `max_bytes` in all (QuotaExceeded past it, nothing left behind), returning each one's
    digest, sorted by path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".partial-{target.name}-", dir=target.parent))
    try:
        digests = copy_files(source, partial(_read_only_file, staging), max_bytes=max_bytes)
        staging.chmod(0o755)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return digests


class Writer(Protocol):
    def write(self, data: bytes, /) -> object: ...


Opener = Callable[[str], AbstractContextManager[Writer]]


def copy_files(source: Path, open_target: Opener, *, max_bytes: int) -> tuple[FileDigest, ...]:
    """Copy the regular files under `source`, walked as the module says, each into what
    `open_target(relative path)` opens for writing, at most `max_bytes` in all
    (QuotaExceeded past it); each one's digest, sorted by path."""
    root = os.open(source, _DIRECTORY)
    try:
        digests = _copy_tree(root, open_target, "", _Budget(max_bytes))
    finally:
        os.close(root)
    return tuple(sorted(digests, key=lambda d: d.path))


@contextmanager
def _read_only_file(folder: Path, relative: str) -> Iterator[Writer]:
    target = folder / relative
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with target.open("xb") as writer:
        yield writer
    target.chmod(0o444)


def verified(root: Path, model: str, version: int, digest: FileDigest) -> Path:
    """The file's path once its bytes are checked against `digest`; TamperedFile."""
    path = version_directory(root, model, version) / digest.path
    try:
        fd = os.open(path, _FILE)
    except OSError as exc:
        raise TamperedFile(f"{digest.path} is gone ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as handle:
        check(handle, digest)
    return path


def check(handle: BinaryIO, digest: FileDigest, copy_to: Writer | None = None) -> None:
    """TamperedFile unless what `handle` holds is what `digest` says (written on to
    `copy_to` meanwhile, if given)."""
    sha, size = _hash(handle, copy_to=copy_to, limit=digest.bytes + 1)  # one byte past: changed
    if sha != digest.sha256 or size != digest.bytes:
        raise TamperedFile(f"{digest.path} changed since it was registered (sha256 differs)")


def remove_version(root: Path, model: str, version: int) -> None:
    shutil.rmtree(version_directory(root, model, version), ignore_errors=True)


class _Budget:
    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes

    def take(self, size: int) -> None:
        if size > self.left:
            raise QuotaExceeded(f"the checkpoint needs more than the {self.left:,} bytes left")
        self.left -= size


def _copy_tree(folder: int, target: Opener, prefix: str, budget: _Budget) -> list[FileDigest]:
    digests = []
    for entry in sorted(os.listdir(folder)):
        try:
            kind = os.stat(entry, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue  # gone since the listing
        relative = f"{prefix}{entry}"
        if stat.S_ISDIR(kind):
            digests += _copy_folder(folder, entry, target, f"{relative}/", budget)
        elif stat.S_ISREG(kind):
            digest = _copy_file(folder, entry, target, relative, budget)
            if digest is not None:
                digests.append(digest)
    return digests


def _copy_folder(
    parent: int, name: str, target: Opener, prefix: str, budget: _Budget
) -> list[FileDigest]:
    try:
        folder = os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError:
        return []  # swapped for a link or a file since the listing: not ours to read
    try:
        return _copy_tree(folder, target, prefix, budget)
    finally:
        os.close(folder)


def _copy_file(
    parent: int, name: str, target: Opener, relative: str, budget: _Budget
) -> FileDigest | None:
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError:
        return None  # swapped for a link since the listing
    with os.fdopen(fd, "rb") as reader:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        budget.take(status.st_size)
        with target(relative) as writer:
            sha, copied = _hash(reader, copy_to=writer, limit=status.st_size)
    return FileDigest(relative, copied, sha)


def _hash(
    reader: BinaryIO, *, copy_to: Writer | None = None, limit: int | None = None
) -> tuple[str, int]:
    """SHA-256 and size of what `reader` holds (its first `limit` bytes: a file that
    grows while it is copied is cut at the size its budget was taken for), written on to
    `copy_to` if given."""
    digest = hashlib.sha256()
    size = 0
    while chunk := reader.read(_CHUNK if limit is None else min(_CHUNK, limit - size)):
        digest.update(chunk)
        size += len(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return digest.hexdigest(), size
