"""Files in storage named by a URL: any fsspec filesystem (S3 through s3fs, a mounted
folder, memory in tests). What the checkpoint store (`workers.checkpoint_store`) and the
outputs store (`scheduler.store.remote_outputs`, `workers.supervisor.outputs`) share:
how a URL becomes a filesystem, how a file the program wrote goes up, how files come down.
Torch-free: the service uses it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

PARTIAL_SUFFIX = ".gangway-partial"  # what listings never show (scheduler.store.outputs too)
MAX_KEY_BYTES = 1024  # S3's longest key
OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "az", "adl"}  # fsspec protocols
S3_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}
CHUNK = 1 << 20


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem of `url` and the path in it. Listings are never cached: other hosts'
    supervisors add to the store all the time. S3 calls time out in a minute, not botocore's
    default of many: a store that hangs is an error the caller reports, not a stall."""
    options: dict[str, Any] = {"use_listings_cache": False}
    if url.startswith(("s3://", "s3a://")):
        options["config_kwargs"] = S3_TIMEOUTS
    elif url.startswith("file://"):
        options["auto_mkdir"] = True  # a folder's parents, as an object store has none
    fs, path = url_to_fs(url, **options)
    return fs, str(path).rstrip("/")


def put_open_file(
    fs: AbstractFileSystem, path: str, source: BinaryIO, size: int | None = None
) -> int:
    """Copy the open file `source` to `path`, no further than `size` (default: its size
    now; a caller that checked a size against a budget passes that one, so a program
    growing the file meanwhile cannot push an upload past it); the bytes copied. Nothing
    shows at `path` until the copy is whole, and a copy that fails leaves nothing there:
    an object store shows an object once its upload completes (a failed one is aborted),
    a mounted folder gets a partial name renamed into place."""
    left = os.fstat(source.fileno()).st_size if size is None else size
    in_place = writes_in_place(fs)
    target = f"{path}{PARTIAL_SUFFIX}" if in_place else path
    sink = fs.open(target, "wb")
    copied = 0
    try:
        while left > 0 and (chunk := source.read(min(CHUNK, left))):
            sink.write(chunk)
            left -= len(chunk)
            copied += len(chunk)
        sink.close()  # an object store completes the upload here
        if in_place:
            fs.mv(target, path)
    except BaseException:
        abandon(fs, sink, target if in_place else None)
        raise
    return copied


def writes_in_place(fs: AbstractFileSystem) -> bool:
    """Whether a file being written shows under its name before it is whole (a folder,
    memory), unlike an object store's upload."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return not protocols & OBJECT_STORES


def abandon(fs: AbstractFileSystem, sink: Any, partial: str | None) -> None:
    """Drop a copy that failed half-way: never let closing it publish what was sent (an
    object store's upload aborted, marked closed so neither close() nor the garbage
    collector sends it); a partial name written in place, removed. The name's previous
    object, if any, stays."""
    with contextlib.suppress(Exception):
        sink.discard()
    with contextlib.suppress(Exception):
        sink.closed = True
    if partial is not None:
        with contextlib.suppress(Exception):
            fs.rm_file(partial)


def unkeepable(key: str) -> str | None:
    """Why an object store could not keep a file under `key` as it is, else None: S3
    refuses keys past 1,024 bytes and s3fs cuts a key at `?versionId=` (a file named
    `w?versionId=1` would overwrite `w`)."""
    if len(key.encode()) > MAX_KEY_BYTES:
        return f"its name is longer than a store key may be ({MAX_KEY_BYTES} bytes)"
    if "?versionId=" in key:
        return "its name holds '?versionId=', which a store reads as a version"
    return None


def get_files(fs: AbstractFileSystem, source: str, files: Iterable[str], local: Path) -> list[str]:
    """Copy `files` (paths relative to `source` in `fs`) into the fresh folder `local`,
    readable by every uid (folders 0755, files 0644, whatever this process's umask); a
    name that would land outside it (`..`, an absolute path) is refused. The names it
    could not place, returned: an object store may hold a file and a folder of one name
    (`a` and `a/b`), which no folder can; the first in name order wins."""
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    unplaced = []
    for relative in sorted(files):
        target = local / relative
        if not target.resolve().is_relative_to(local.resolve()):
            raise ValueError(f"a stored file escapes its folder: {relative}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f"{source}/{relative}", str(target))
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            unplaced.append(relative)
    for folder, _, names in os.walk(local):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    return unplaced


def fetch_folder(url: str, local: Path) -> list[str]:
    """Everything under `url` copied into the fresh folder `local` (empty when there is
    nothing there), as `get_files` does, the names it could not place returned; a store
    that cannot be read raises."""
    fs, path = filesystem(url)
    keys = fs.find(path) if fs.exists(path) else []
    return get_files(fs, path, [str(key)[len(path) :].strip("/") for key in keys], local)


def modified(info: dict[str, Any]) -> datetime:
    """A listed file's time, whichever way its filesystem says it (S3, local, memory)."""
    for key in ("LastModified", "last_modified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value, UTC)
    return datetime.now(UTC)


class StoredFolder:
    """Everything under one URL (a job's checkpoints or outputs), for deleting it whole."""

    def __init__(self, url: str, fs: AbstractFileSystem | None = None) -> None:
        self.url = url.rstrip("/")
        if fs is None:
            fs, path = filesystem(self.url)
        else:
            path = str(fs._strip_protocol(self.url)).rstrip("/")
        self.fs, self.path = fs, path

    def delete(self) -> bool:
        """Delete every file under it; whether there was anything."""
        if not self.fs.exists(self.path):
            return False
        self.fs.rm(self.path, recursive=True)
        return True
