"""Uploaded working directories: a zip file per sha256 under a directory, a row per zip.

The file is written first (to a temporary name, then renamed: a reader never sees half a
zip) and the row after, so a row always has its file. `collect` deletes packages no
active job references once unused for a grace period; the grace keeps a package that was
uploaded a moment ago for a job not yet submitted.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gangway.packaging import DEFAULT_MAX_FILES, DEFAULT_MAX_UNPACKED_BYTES, check_zip
from scheduler.model import UNFINISHED_STATES
from scheduler.store.specs import spec_from_json
from scheduler.store.tables import JobRow, PackageRow

ACTIVE_STATES = tuple(s.value for s in UNFINISHED_STATES)


class PackageTooLarge(ValueError):
    """The upload passed the size limit."""


class DigestMismatch(ValueError):
    """The bytes uploaded do not hash to the name they were uploaded under."""


@dataclass(frozen=True)
class PackageRecord:
    sha256: str
    size_bytes: int
    owner: str
    created_at: datetime
    last_used_at: datetime


class PackageStore:
    """`max_unpacked_bytes` and `max_files` bound what a stored zip declares it unpacks
    to: every node that runs a job unpacks its package, so a small zip must not become
    gigabytes or millions of files there (see `gangway.packaging.check_zip`)."""

    def __init__(
        self,
        engine: Engine,
        root: Path,
        *,
        max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        self._engine = engine
        self.root = root
        self.max_unpacked_bytes = max_unpacked_bytes
        self.max_files = max_files

    def path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.zip"

    def get(self, sha256: str) -> PackageRecord | None:
        with Session(self._engine) as session:
            row = session.get(PackageRow, sha256)
            return _record(row) if row is not None and self.path(sha256).is_file() else None

    async def put(
        self, sha256: str, chunks: AsyncIterator[bytes], *, owner: str, max_bytes: int
    ) -> tuple[PackageRecord, bool]:
        """Store the upload under its hash; (record, created). One already stored is kept
        (the same name is the same bytes) and the upload is not read. PackageTooLarge,
        DigestMismatch and `check_zip`'s ZipRefused leave nothing behind."""
        found = self.get(sha256)
        if found is not None:
            return found, False
        self.root.mkdir(parents=True, exist_ok=True)
        size = await self._receive(sha256, chunks, max_bytes)
        now = datetime.now(UTC)
        row = PackageRow(
            sha256=sha256, size_bytes=size, owner=owner, created_at=now, last_used_at=now
        )
        try:
            with Session(self._engine) as session, session.begin():
                session.add(row)
                record = _record(row)
        except IntegrityError:  # a twin upload of the same bytes won the race
            raced = self.get(sha256)
            if raced is None:
                raise
            return raced, False
        return record, True

    async def _receive(self, sha256: str, chunks: AsyncIterator[bytes], max_bytes: int) -> int:
        digest = hashlib.sha256()
        size = 0
        handle, temporary = tempfile.mkstemp(dir=self.root, suffix=".part")
        try:
            with os.fdopen(handle, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise PackageTooLarge(f"a package may hold at most {max_bytes} bytes")
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise DigestMismatch(
                    f"the body's sha256 is {digest.hexdigest()}, not the {sha256} in the path"
                )
            await asyncio.to_thread(  # listing a large directory should not stall the API
                check_zip,
                Path(temporary),
                max_unpacked_bytes=self.max_unpacked_bytes,
                max_files=self.max_files,
            )
            os.replace(temporary, self.path(sha256))
        finally:
            Path(temporary).unlink(missing_ok=True)
        return size

    def touch(self, sha256: str) -> None:
        """A job was submitted with it: restart its grace period."""
        with Session(self._engine) as session, session.begin():
            row = session.get(PackageRow, sha256)
            if row is not None:
                row.last_used_at = datetime.now(UTC)

    def collect(self, *, grace_s: float, now: datetime | None = None) -> list[str]:
        """Delete packages that no unfinished job references and nobody used for
        `grace_s`; returns their hashes."""
        cutoff = (now or datetime.now(UTC)) - timedelta(seconds=grace_s)
        with Session(self._engine) as session, session.begin():
            in_use = _referenced(session)
            stale = session.scalars(
                select(PackageRow).where(PackageRow.last_used_at < cutoff)
            ).all()
            removed = [row.sha256 for row in stale if row.sha256 not in in_use]
            for row in stale:
                if row.sha256 in removed:
                    session.delete(row)
        for sha256 in removed:
            self.path(sha256).unlink(missing_ok=True)
        return removed


def _referenced(session: Session) -> set[str]:
    specs = session.scalars(select(JobRow.spec).where(JobRow.state.in_(ACTIVE_STATES))).all()
    return {package for spec in specs if (package := spec_from_json(spec).code.package)}


def _record(row: PackageRow) -> PackageRecord:
    return PackageRecord(row.sha256, row.size_bytes, row.owner, row.created_at, row.last_used_at)
