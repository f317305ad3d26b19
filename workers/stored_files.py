"""Files in storage named by a URL: any fsspec filesystem (S3 through s3fs, a mounted
folder, memory in tests). What the checkpoint store (`workers.checkpoint_store`) and the
outputs store (`scheduler.store.remote_outputs`, `workers.supervisor.outputs`) share:
how a URL becomes a filesystem, how a file the program wrote goes up, how files come down.
Torch-free: the service uses it too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

S3_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}
CHUNK = 1 << 20


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem of `url` and the path in it. Listings are never cached: other hosts'
    supervisors add to the store all the time. S3 calls time out in a minute, not botocore's
    default of many: a store that hangs is an error the caller reports, not a stall."""
    options: dict[str, Any] = {"use_listings_cache": False}
    if url.startswith(("s3://", "s3a://")):
        options["config_kwargs"] = S3_TIMEOUTS
    fs, path = url_to_fs(url, **options)
    return fs, str(path).rstrip("/")


def put_open_file(fs: AbstractFileSystem, path: str, source: BinaryIO) -> int:
    """Copy the open file `source` to `path`, no further than its size when it was opened
    (a program appending meanwhile cannot make an upload endless); the bytes copied. An
    object store shows the object only once it is whole."""
    size = os.fstat(source.fileno()).st_size
    left = size
    with fs.open(path, "wb") as sink:
        while left > 0 and (chunk := source.read(min(CHUNK, left))):
            sink.write(chunk)
            left -= len(chunk)
    return size - left


def get_files(fs: AbstractFileSystem, source: str, files: Iterable[str], local: Path) -> None:
    """Copy `files` (paths relative to `source` in `fs`) into the fresh folder `local`;
    a name that would land outside it (`..`, an absolute path) is refused."""
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    for relative in files:
        target = local / relative
        if not target.resolve().is_relative_to(local.resolve()):
            raise ValueError(f"a stored file escapes its folder: {relative}")
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(f"{source}/{relative}", str(target))


def fetch_folder(url: str, local: Path) -> None:
    """Everything under `url` copied into the fresh folder `local` (empty when there is
    nothing there); a store that cannot be read raises."""
    fs, path = filesystem(url)
    keys = fs.find(path) if fs.exists(path) else []
    get_files(fs, path, [str(key)[len(path) :].strip("/") for key in keys], local)


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
