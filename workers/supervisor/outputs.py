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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fsspec import AbstractFileSystem

from workers.stored_files import (
    PARTIAL_SUFFIX,
    StoredFolder,
    fetch_folder,
    put_open_file,
    unkeepable,
)

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
    (`put_open_file`: nothing shows until it is). What this supervisor uploaded is
    remembered (size, modification time), so an unchanged file is not sent again and
    the bytes kept count against `max_bytes` across collections, a file replaced
    counting once; a file is sent no further than the size checked against the budget.
    A name a store cannot keep as it is (a key past S3's 1,024 bytes, one S3 would cut
    at `?versionId=`) is skipped. A file where a folder was sent before, or the reverse,
    replaces what was sent (the program's folder holds one of them now). One file that
    fails does not stop the others; the collection then raises `UploadIncomplete`, so
    the caller's retry sends what is missing."""

    def __init__(self, url: str, max_bytes: int, fs: AbstractFileSystem | None = None) -> None:
        folder = StoredFolder(url, fs)
        self.url, self._fs, self._path = folder.url, folder.fs, folder.path
        self._max_bytes = max_bytes
        self._sent: dict[Path, tuple[int, int]] = {}  # relative path -> (size, mtime_ns)
        self._kept = 0  # bytes of what was sent and is still there
        self._folders: set[Path] = set()  # every folder of a file sent

    def collect(self, source: Path) -> Collected:
        done, failures = Collected(), []
        for relative, opened in _collectable(source, done):
            if not self._keepable(relative):
                done.skipped += 1
                continue
            try:
                self._upload_one(relative, opened, done)
            except Exception as exc:  # the store, the network, or this one name
                failures.append(f"{relative}: {exc}")
        if failures:
            raise UploadIncomplete(done, failures)
        return done

    def _keepable(self, relative: Path) -> bool:
        return unkeepable(f"{self._path}/{relative.as_posix()}") is None

    def _upload_one(self, relative: Path, source: BinaryIO, done: Collected) -> None:
        info = os.fstat(source.fileno())
        was = self._sent.get(relative)
        if was == (info.st_size, info.st_mtime_ns):
            done.unchanged += 1
            return
        kept = self._kept - (was[0] if was else 0)
        if kept + info.st_size > self._max_bytes or (was is None and len(self._sent) >= MAX_FILES):
            done.over_quota += 1
            return
        self._replace_conflicts(relative)
        key = f"{self._path}/{relative.as_posix()}"
        size = put_open_file(self._fs, key, source, size=info.st_size)
        self._sent[relative], self._kept = (size, info.st_mtime_ns), kept + size
        self._folders.update(relative.parents)
        done.files += 1
        done.bytes += size

    def _replace_conflicts(self, relative: Path) -> None:
        """Delete what was sent under a name `relative` now takes: a file where one of
        its folders is, or files under it where it is a file."""
        stale = [p for p in relative.parents if p in self._sent]
        if relative in self._folders:
            stale += [p for p in self._sent if relative in p.parents]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):  # gone already
                self._fs.rm_file(f"{self._path}/{path.as_posix()}")
            self._kept -= self._sent.pop(path)[0]
        self._folders.discard(relative)  # once what was under it is gone


class UploadIncomplete(Exception):
    """Some files of a collection could not be sent; `done` counts the rest."""

    def __init__(self, done: Collected, failures: list[str]) -> None:
        shown = "; ".join(failures[:3]) + (
            f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
        )
        super().__init__(f"{len(failures)} file(s) not uploaded ({shown})")
        self.done = done


def fetch_inputs(urls: dict[str, str], into: Path, log: Callable[[str], None]) -> dict[str, str]:
    """Other jobs' outputs in storage named by a URL (`inputs_from`), each fetched whole
    into `into/<name>` on this host (the same `rank-<r>/...` layout as a shared folder);
    name -> local folder, for `workspace.input_mounts`. A job that wrote none gets an
    empty folder; a store that cannot be read raises (the attempt fails with the reason);
    names no folder can hold (a file and a folder of one name) are left out, said in `log`."""
    local: dict[str, str] = {}
    for name, url in sorted(urls.items()):
        unplaced = fetch_folder(url, into / name)
        if unplaced:
            log(
                f"[gangway] inputs: {len(unplaced)} file(s) of {name} left out (a file and a "
                f"folder of one name): {', '.join(unplaced[:3])}"
            )
        local[name] = str(into / name)
    return local
