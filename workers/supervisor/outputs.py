"""Collect what a rank wrote to its outputs folder into the service's storage: a folder
the hosts share (`collect`), or storage named by a URL (`OutputsUpload`; `fetch_inputs`
brings other jobs' outputs from there for `inputs_from`).

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

from fsspec import AbstractFileSystem

from workers.stored_files import StoredFolder, fetch_folder, put_open_file

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
    for relative, opened in _collectable(source, done):
        _collect_one(opened, target / relative, done, max_bytes)
    return done


def _collectable(source: Path, done: Collected) -> Iterator[tuple[Path, BinaryIO]]:
    """The files under `source` to copy, each open until the next is asked for; what is
    not one (a link, a special file, a name that is not text, a partial name) counted
    in `done.skipped`."""
    for relative, opened in regular_files(source):
        if opened is None or relative.name.endswith(PARTIAL_SUFFIX):
            if opened is not None:
                opened.close()
            done.skipped += 1
            continue
        with opened:
            yield relative, opened


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


class OutputsUpload:
    """One rank's outputs copied up to storage named by a URL (`<job url>/rank-<r>`),
    for hosts that share no disk: the same walk as `collect`, each file uploaded whole
    (an object store shows it once complete). What this supervisor uploaded is
    remembered (size, modification time), so an unchanged file is not sent again and
    the bytes kept count against `max_bytes` across collections, a file replaced
    counting once."""

    def __init__(self, url: str, max_bytes: int, fs: AbstractFileSystem | None = None) -> None:
        folder = StoredFolder(url, fs)
        self.url, self._fs, self._path = folder.url, folder.fs, folder.path
        self._max_bytes = max_bytes
        self._sent: dict[Path, tuple[int, int]] = {}  # relative path -> (size, mtime_ns)

    def collect(self, source: Path) -> Collected:
        done = Collected()
        for relative, opened in _collectable(source, done):
            self._upload_one(relative, opened, done)
        return done

    def _upload_one(self, relative: Path, source: BinaryIO, done: Collected) -> None:
        info = os.fstat(source.fileno())
        was = self._sent.get(relative)
        if was == (info.st_size, info.st_mtime_ns):
            done.unchanged += 1
            return
        kept = sum(size for size, _ in self._sent.values()) - (was[0] if was else 0)
        if kept + info.st_size > self._max_bytes or len(self._sent) >= MAX_FILES:
            done.over_quota += 1
            return
        size = put_open_file(self._fs, f"{self._path}/{relative.as_posix()}", source)
        self._sent[relative] = (size, info.st_mtime_ns)
        done.files += 1
        done.bytes += size


def fetch_inputs(urls: dict[str, str], into: Path) -> dict[str, str]:
    """Other jobs' outputs in storage named by a URL (`inputs_from`), each fetched whole
    into `into/<name>` on this host (the same `rank-<r>/...` layout as a shared folder);
    name -> local folder, for `workspace.input_mounts`. A job that wrote none gets an
    empty folder; a store that cannot be read raises (the attempt fails with the reason)."""
    local: dict[str, str] = {}
    for name, url in sorted(urls.items()):
        fetch_folder(url, into / name)
        local[name] = str(into / name)
    return local
