"""Model versions' files in storage named by a URL (`GANGWAY_STORAGE_URL`/models), for
hosts that share no disk: `<root>/<model>/v<N>/` holds the checkpoint's files as
`scheduler.store.model_files` copies them into a folder: walked by descriptor, within the
owner's quota, each file's SHA-256 taken on the way and kept in the version's row.

No rename in an object store: the version's row is what makes it exist (it is added only
after every file is up), a registration that fails deletes what it sent (a file cut off
mid-copy is abandoned, never published), and one that died half-way (the service killed)
leaves files no row names under a number never handed out again. A file no store key can
hold as it is (`stored_files.unkeepable`) refuses the registration before a byte is sent.
A file is served only after the service fetched it (at most `_MAX_COPIES` at once) and
its bytes matched the recorded digest; jobs starting from a version get its files
fetched onto their hosts by their supervisors, unchecked: only the service and the
supervisors can write the store, and every name in it is one the registration recorded.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from fsspec import AbstractFileSystem

from scheduler.store.model_files import TamperedFile, check, copy_files
from scheduler.store.registry import FileDigest
from workers.stored_files import StoredFolder, abandon, unkeepable, writes_in_place

# Downloads being fetched at once (each a temporary copy of a whole file on the service's
# disk, held until its response is sent); one more waits this long, then is a 503.
_MAX_COPIES = 4
_COPIES = threading.BoundedSemaphore(_MAX_COPIES)
COPY_WAIT_S = 30.0


class StoreFailed(Exception):
    """The store could not take a file (the network, its permissions): not the
    checkpoint's fault, unlike an error reading it."""


class UnkeepableName(ValueError):
    """The checkpoint holds a file whose name no store key can hold as it is."""


class _Upload:
    """One file going up, its store's errors told apart from the source's: sent when
    the copy ends well, abandoned (never published) when it does not."""

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self._fs, self._path = fs, path
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

    def __exit__(self, failed: type[BaseException] | None, *_: object) -> None:
        if failed is not None:  # the registration deletes what was sent, as it can
            abandon(self._fs, self._file, self._path if writes_in_place(self._fs) else None)
            return
        try:
            self._file.close()
        except Exception as exc:
            raise StoreFailed(str(exc)) from exc


def model_version_url(root_url: str, model: str, version: int) -> str:
    """Where a version's files live in the store (the supervisors fetch from here)."""
    return f"{root_url.rstrip('/')}/{model}/v{version}"


class RemoteModelFiles:
    def __init__(self, url: str, fs: AbstractFileSystem | None = None) -> None:
        root = StoredFolder(url, fs)
        self.url, self.fs = root.url, root.fs

    def version_url(self, model: str, version: int) -> str:
        return model_version_url(self.url, model, version)

    def store(
        self, source: Path, model: str, version: int, *, max_bytes: int
    ) -> tuple[FileDigest, ...]:
        """Copy the checkpoint folder `source` up as the version's files (see the module);
        UnkeepableName for a file no key can hold, before anything is sent."""
        folder = self._folder(model, version)

        def upload(relative: str) -> _Upload:
            key = f"{folder.path}/{relative}"
            if (why := unkeepable(key)) is not None:
                raise UnkeepableName(f"the checkpoint's file {relative!r} cannot be stored: {why}")
            return _Upload(self.fs, key)

        try:
            return copy_files(source, upload, max_bytes=max_bytes)
        except BaseException:
            with contextlib.suppress(Exception):
                folder.delete()
            raise

    def verified_copy(
        self, model: str, version: int, digest: FileDigest
    ) -> tuple[Path, Callable[[], None]]:
        """The file fetched into a temporary folder and checked against `digest`
        (TamperedFile when its bytes differ or it is gone), and what removes the folder."""
        if not _COPIES.acquire(timeout=COPY_WAIT_S):
            raise StoreFailed(f"{_MAX_COPIES} downloads of model files are being fetched")
        folder = Path(tempfile.mkdtemp(prefix="gangway-model-file-"))
        target = folder / "file"

        def done() -> None:
            shutil.rmtree(folder, ignore_errors=True)
            _COPIES.release()

        try:
            try:
                opened = self.fs.open(f"{self._folder(model, version).path}/{digest.path}", "rb")
            except FileNotFoundError as exc:
                raise TamperedFile(f"{digest.path} is gone from the store") from exc
            with opened, target.open("wb") as sink:
                check(opened, digest, copy_to=sink)
        except BaseException:
            done()
            raise
        return target, done

    def remove(self, model: str, version: int) -> None:
        self._folder(model, version).delete()

    def _folder(self, model: str, version: int) -> StoredFolder:
        return StoredFolder(self.version_url(model, version), self.fs)
