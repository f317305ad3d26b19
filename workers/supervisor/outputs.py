"""Collect what a rank wrote to its outputs folder into the service's storage.

The folder belongs to the program (an attacker's uid), and the supervisor reads it with
more rights than the program has, so every step is one the program cannot redirect: the
tree is walked by directory descriptor (`regular_files`: each folder and file opened
relative to its parent with O_NOFOLLOW and O_NONBLOCK, so links are never followed and a
FIFO never waited on), and each file is checked to be a regular file after it is open (a
file swapped for a link or a FIFO between listing and reading is skipped).
What is copied lands as `<name>.gangway-partial` and is renamed when complete, so a
listing never shows half a file. A file already collected with the same size and
modification time is not copied again (collection runs at every checkpoint and at the
end). Names that are not UTF-8 text are skipped: the API could not show them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

PARTIAL_SUFFIX = ".gangway-partial"
MAX_FILES = 100_000
_CHUNK = 1 << 20


@dataclass
class Collected:
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    over_quota: int = 0  # files left out: the quota or the file count was reached
    skipped: int = 0  # links, devices, FIFOs, names that are not text

    def summary(self) -> str:
        text = f"outputs: {self.files} file(s) collected ({self.bytes} bytes)"
        if self.over_quota:
            text += f", {self.over_quota} left out (over the outputs quota)"
        if self.skipped:
            text += f", {self.skipped} skipped (links, special files or names not UTF-8)"
        return text


def collect(source: Path, target: Path, *, max_bytes: int) -> Collected:
    """Copy the regular files under `source` to the same paths under `target`, adding at
    most `max_bytes` (see the module docstring)."""
    done = Collected()
    for relative, opened in regular_files(source):
        if opened is None or relative.name.endswith(PARTIAL_SUFFIX):
            done.skipped += 1
            continue
        with opened:
            _collect_one(opened, target / relative, done, max_bytes)
    return done


def regular_files(source: Path) -> Iterator[tuple[Path, BinaryIO | None]]:
    """Every file under `source` a program wrote, by its path relative to `source`, opened
    for reading (the caller closes it); None for what is not a regular file or has a name
    that is not text (links, devices, FIFOs). Every folder, `source` included, is opened
    relative to its parent with O_NOFOLLOW | O_DIRECTORY | O_NONBLOCK: a folder the program
    swaps for a link or a FIFO mid-walk is skipped, never followed or waited on (Python's
    `os.fwalk` opens folders by name, following a link and blocking on a FIFO)."""
    try:
        top = os.open(source, _FOLDER)
    except OSError:
        return
    yield from _walk(top, Path(), depth=0)


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 32


def _walk(folder_fd: int, relative: Path, depth: int) -> Iterator[tuple[Path, BinaryIO | None]]:
    """The files under the open folder `folder_fd` (closed when done), then its folders'."""
    try:
        with os.scandir(folder_fd) as entries:
            listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        folders = []
        for name, is_folder in sorted(listed):
            if not _is_text(name):
                yield relative / name, None
            elif is_folder:
                folders.append(name)
            else:
                yield relative / name, _open_regular(folder_fd, name)
        for name in folders:
            if depth >= MAX_DEPTH:
                yield relative / name, None
                continue
            try:
                child = os.open(name, _FOLDER, dir_fd=folder_fd)
            except OSError:  # swapped for a link, a FIFO or a file, or gone
                yield relative / name, None
                continue
            yield from _walk(child, relative / name, depth + 1)
    finally:
        os.close(folder_fd)


def _open_regular(folder_fd: int, name: str) -> BinaryIO | None:
    try:
        fd = os.open(name, _FILE, dir_fd=folder_fd)
    except OSError:
        return None
    opened = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        opened.close()
        return None
    return opened


def _collect_one(source: BinaryIO, destination: Path, done: Collected, max_bytes: int) -> None:
    info = os.fstat(source.fileno())
    if _same(destination, info):
        done.unchanged += 1
        return
    if done.bytes + info.st_size > max_bytes or done.files >= MAX_FILES:
        done.over_quota += 1
        return
    copied = _copy(source, destination, max_bytes - done.bytes)
    if copied is None:
        done.over_quota += 1
        return
    os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns))
    done.files += 1
    done.bytes += copied


def _copy(source: BinaryIO, destination: Path, budget: int) -> int | None:
    """Copy to `destination` through a partial file; None (nothing kept) when the file
    grew past `budget` while it was read."""
    destination.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + PARTIAL_SUFFIX)
    size = 0
    with partial.open("wb") as sink:
        while chunk := source.read(_CHUNK):
            size += len(chunk)
            if size > budget:
                break
            sink.write(chunk)
    if size > budget:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        return None
    partial.chmod(0o644)
    partial.replace(destination)
    return size


def _same(destination: Path, info: os.stat_result) -> bool:
    try:
        kept = destination.stat()
    except OSError:
        return False
    return kept.st_size == info.st_size and kept.st_mtime_ns == info.st_mtime_ns


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(ord(c) < 32 for c in name)
