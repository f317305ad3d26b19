"""Model versions' files in storage named by a URL (`GANGWAY_STORAGE_URL`/models), for
hosts that share no disk: `<root>/<model>/v<N>/` holds the checkpoint's files as
`scheduler.store.model_files` copies them into a folder: walked by descriptor, within the
owner's quota, each file's SHA-256 taken on the way and kept in the version's row.

No rename in an object store: the version's row is what makes it exist (it is added only
after every file is up), a registration that fails deletes what it sent, and one that
died half-way (the service killed) leaves files no row names, which the next version of
that number (only after the model was deleted and made again) clears before it sends. A
file is served only after the service fetched it and its bytes matched the recorded
digest; jobs starting from a version get it fetched onto their hosts by their supervisors.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from fsspec import AbstractFileSystem

from scheduler.store.model_files import TamperedFile, check, copy_files
from scheduler.store.registry import FileDigest
from workers.stored_files import StoredFolder


class StoreFailed(Exception):
    """The store could not take a file (the network, its permissions): not the
    checkpoint's fault, unlike an error reading it."""


class _Upload:
    """One file going up, its store's errors told apart from the source's."""

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        try:
            self._file = fs.open(path, "wb")
        except Exception as exc:
            raise StoreFailed(f"{path}: {exc}") from exc

    def write(self, data: bytes, /) -> int:
        try:
            return int(self._file.write(data))
        except Exception as exc:
            raise StoreFailed(str(exc)) from exc

    def __enter__(self) -> _Upload:
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self._file.close()  # sends it; a failed registration then deletes the folder
        except Exception as exc:
            raise StoreFailed(str(exc)) from exc


class RemoteModelFiles:
    def __init__(self, url: str, fs: AbstractFileSystem | None = None) -> None:
        root = StoredFolder(url, fs)
        self.url, self.fs = root.url, root.fs

    def version_url(self, model: str, version: int) -> str:
        return f"{self.url}/{model}/v{version}"

    def store(
        self, source: Path, model: str, version: int, *, max_bytes: int
    ) -> tuple[FileDigest, ...]:
        """Copy the checkpoint folder `source` up as the version's files (see the module)."""
        folder = self._folder(model, version)
        folder.delete()  # what a registration that died half-way left under this number
        try:
            return copy_files(
                source, lambda relative: _Upload(self.fs, f"{folder.path}/{relative}"),
                max_bytes=max_bytes,
            )  # fmt: skip
        except BaseException:
            with contextlib.suppress(Exception):
                folder.delete()
            raise

    def verified_copy(
        self, model: str, version: int, digest: FileDigest
    ) -> tuple[Path, Callable[[], None]]:
        """The file fetched into a temporary folder and checked against `digest`
        (TamperedFile when its bytes differ or it is gone), and what removes the folder."""
        folder = Path(tempfile.mkdtemp(prefix="gangway-model-file-"))
        target = folder / "file"
        try:
            try:
                opened = self.fs.open(f"{self._folder(model, version).path}/{digest.path}", "rb")
            except FileNotFoundError as exc:
                raise TamperedFile(f"{digest.path} is gone from the store") from exc
            with opened, target.open("wb") as sink:
                check(opened, digest, copy_to=sink)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return target, partial(shutil.rmtree, folder, ignore_errors=True)

    def remove(self, model: str, version: int) -> None:
        self._folder(model, version).delete()

    def _folder(self, model: str, version: int) -> StoredFolder:
        return StoredFolder(self.version_url(model, version), self.fs)
