"""Downloads of a job's outputs into a folder of the caller's, for `Client.download` and
`AsyncClient.download`: each file lands under `to` at its relative path, never outside
`to` (a path with '..', absolute, or through a symlink that leads out is refused before
anything is written), and never half-written under its final name (it is written beside
it and renamed when complete, so an interrupted download leaves the old file, if any).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from gangway.calls import relative_path
from gangway.errors import error_for_status


def destination(to: str | Path, path: str) -> Path:
    """Where the output `path` is written under `to`; a 422 naming `path` (as the server
    would answer) when that is not inside `to`."""
    base = Path(to).resolve()
    target = base.joinpath(*relative_path(path))
    existing = target.parent
    while existing != base and not existing.exists():
        existing = existing.parent  # what does not exist yet cannot be a symlink
    if not (target.is_relative_to(base) and existing.resolve().is_relative_to(base)):
        message = f"{path!r} would be written outside {base}"
        raise error_for_status(422, "validation_error", message, "path")
    return target


class PartFile:
    """`<dest's folder>/.<name>.<random>.part`, renamed over `dest` by `commit`; `with`
    commits on success and discards on an error. With `sha256`, `commit` first checks
    the bytes written against it: a file that differs is discarded, never renamed into
    place (a 409, as the server answers for a file that changed)."""

    def __init__(
        self, dest: Path, temporary: Path, file: BinaryIO, sha256: str | None = None
    ) -> None:
        self.dest, self._temporary, self._file = dest, temporary, file
        self.bytes = 0
        self._expected = sha256
        self._digest = hashlib.sha256()

    @classmethod
    def open(cls, dest: Path, sha256: str | None = None) -> PartFile:
        dest.parent.mkdir(parents=True, exist_ok=True)
        temporary = dest.with_name(f".{dest.name[:200]}.{uuid.uuid4().hex[:12]}.part")
        return cls(dest, temporary, temporary.open("xb"), sha256)

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self.bytes += len(chunk)
        if self._expected is not None:
            self._digest.update(chunk)

    def commit(self) -> None:
        if self._expected is not None and self._digest.hexdigest() != self._expected:
            self.discard()
            message = f"{self.dest.name}: the bytes received do not match sha256 {self._expected}"
            raise error_for_status(409, "conflict", message, None)
        self._file.close()
        os.replace(self._temporary, self.dest)

    def discard(self) -> None:
        self._file.close()
        self._temporary.unlink(missing_ok=True)

    def __enter__(self) -> PartFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()
