"""A model version's files: copied once out of a job's checkpoint, checked on every read.

`<models root>/<model>/v<N>/` holds a copy of the checkpoint directory the version was
made from (DCP shards and `.metadata`). The checkpoint was written by a rank program,
which is untrusted: only regular files are copied, opened without following symlinks,
so a link planted in a checkpoint copies nothing of the service's. The copy is written
under a temporary name and renamed when complete, so a version's directory is never
half-written. Every file's SHA-256 is taken while copying and kept in the version's row;
`verified` recomputes it before a file is served, and a file whose bytes changed (or
that is gone) is refused, never sent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from scheduler.store.registry import FileDigest

_CHUNK = 1 << 20


class TamperedFile(Exception):
    """A version's file no longer has the bytes it was registered with."""


def version_directory(root: Path, model: str, version: int) -> Path:
    return root / model / f"v{version}"


def copy_checkpoint(source: Path, target: Path) -> tuple[FileDigest, ...]:
    """Copy the regular files under `source` to `target` (which must not exist),
    returning each one's digest, sorted by path."""
    partial = target.with_name(f".partial-{target.name}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    digests = []
    for relative in _regular_files(source):
        digests.append(_copy_file(source / relative, partial / relative, relative))
    partial.rename(target)
    return tuple(sorted(digests, key=lambda d: d.path))


def checkpoint_bytes(source: Path) -> int:
    """What `copy_checkpoint` would copy, in bytes."""
    return sum(os.lstat(source / relative).st_size for relative in _regular_files(source))


def verified(root: Path, model: str, version: int, digest: FileDigest) -> Path:
    """The file's path once its bytes are checked against `digest`; TamperedFile."""
    path = version_directory(root, model, version) / digest.path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TamperedFile(f"{digest.path} is gone ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as handle:
        sha, size = _hash(handle)
    if sha != digest.sha256 or size != digest.bytes:
        raise TamperedFile(f"{digest.path} changed since it was registered (sha256 differs)")
    return path


def remove_version(root: Path, model: str, version: int) -> None:
    shutil.rmtree(version_directory(root, model, version), ignore_errors=True)


def _regular_files(source: Path) -> list[str]:
    """Paths (relative, '/'-separated) of the regular files under `source`; links and
    anything else are skipped, and no link to a folder is walked into."""
    found = []
    for folder, dirs, files in os.walk(source, followlinks=False):
        base = Path(folder)
        dirs[:] = [d for d in dirs if stat.S_ISDIR(os.lstat(base / d).st_mode)]
        for name in files:
            if stat.S_ISREG(os.lstat(base / name).st_mode):
                found.append((base / name).relative_to(source).as_posix())
    return found


def _copy_file(source: Path, target: Path, relative: str) -> FileDigest:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as reader, target.open("xb") as writer:
        sha, size = _hash(reader, copy_to=writer)
    target.chmod(0o444)
    return FileDigest(relative, size, sha)


def _hash(reader: BinaryIO, *, copy_to: BinaryIO | None = None) -> tuple[str, int]:
    """SHA-256 and size of what `reader` holds, written on to `copy_to` if given."""
    digest = hashlib.sha256()
    size = 0
    while chunk := reader.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if copy_to is not None:
            copy_to.write(chunk)
    return digest.hexdigest(), size
