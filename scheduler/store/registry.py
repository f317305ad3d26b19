"""The model registry: named models, their immutable versions and the aliases on them.

A version is made once, from a complete checkpoint of a job, and never changes: its
files are copied out of the job's checkpoint directory (which the trainer prunes) into
the registry's storage, and the row keeps the SHA-256 and size of every file, the job's
spec, the metrics it reported at that step, and the job and attempt that produced it
(`scheduler.registry_files` does the copying and the checking; this module only the
rows). A model has one owner and a list of readers (user names, and `queue:<name>` for a
queue's members); who may see or change
what is the API's to decide (`api.registry`), from what these rows say.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    JSON,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    and_,
    delete,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, aliased, mapped_column
from sqlalchemy.sql.elements import ColumnElement

from scheduler.store.base import Repository
from scheduler.store.tables import Base, UTCDateTime

MAX_VERSION = 2**31 - 1
QUEUE_READER = "queue:"  # a reader naming a queue: its members read


class RegisteredModelRow(Base):
    __tablename__ = "registered_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    owner: Mapped[str] = mapped_column(String(100))
    readers: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The number the next version gets. Numbers are never reused, and a model whose
    # versions are all deleted keeps its row: a job that pinned (name, number) never
    # finds other weights there, whoever registers later.
    next_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class ModelVersionRow(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(Integer, index=True)  # lineage: kept if the job goes
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # {path, bytes, sha256}
    created_by: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ModelAliasRow(Base):
    __tablename__ = "model_aliases"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("registered_models.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class Reader(Protocol):
    """Who asks to read a model (the API's `Principal`)."""

    @property
    def name(self) -> str: ...
    @property
    def is_admin(self) -> bool: ...
    @property
    def queues(self) -> Collection[str]: ...


@dataclass(frozen=True, slots=True)
class FileDigest:
    path: str  # relative to the version's directory, '/'-separated
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ModelVersion:
    model: str
    version: int
    job_id: int
    attempt: int
    step: int
    spec: dict[str, Any]
    metrics: dict[str, float]
    files: tuple[FileDigest, ...]
    created_by: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RegisteredModel:
    name: str
    owner: str
    readers: tuple[str, ...]
    created_at: datetime
    versions: tuple[ModelVersion, ...] = ()
    aliases: dict[str, int] = field(default_factory=dict)

    def readable_by(self, caller: Reader) -> bool:
        """Admins, the owner, a reader by name, a member of a queue among the readers
        (`queue:<name>`)."""
        if caller.is_admin or caller.name == self.owner or caller.name in self.readers:
            return True
        return any(QUEUE_READER + queue in self.readers for queue in caller.queues)


class ModelNotFound(Exception):
    """No such model, version or alias (or one the caller may not know of)."""


class QuotaExceeded(Exception):
    """The model's owner has no room for another version."""


class ModelRegistry(Repository):
    def model(self, name: str) -> RegisteredModel:
        """The model with its versions (oldest first) and aliases; ModelNotFound."""
        with Session(self._engine) as session:
            row = _model_row(session, name)
            versions = session.scalars(
                select(ModelVersionRow)
                .where(ModelVersionRow.model_id == row.id)
                .order_by(ModelVersionRow.version)
            )
            aliases = session.scalars(select(ModelAliasRow).where(ModelAliasRow.model_id == row.id))
            return _model(
                row,
                tuple(_version(name, v) for v in versions),
                {a.alias: a.version for a in aliases},
            )

    def models(self) -> list[RegisteredModel]:
        """Every model (without versions), by name."""
        with Session(self._engine) as session:
            rows = session.scalars(select(RegisteredModelRow).order_by(RegisteredModelRow.name))
            return [_model(row, (), {}) for row in rows]

    def reserve_version(self, name: str, *, owner: str, readers: Sequence[str]) -> tuple[int, str]:
        """The next version number of `name` (its own, never handed out twice, even to
        concurrent callers), creating the model for `owner` with `readers` if it is new;
        and the model's owner, which the caller must check (a concurrent caller may
        have created the model first)."""
        bump = (
            update(RegisteredModelRow)
            .where(RegisteredModelRow.name == name)
            .values(next_version=RegisteredModelRow.next_version + 1)
            .returning(RegisteredModelRow.next_version, RegisteredModelRow.owner)
        )
        with Session(self._engine) as session, session.begin():
            found = session.execute(bump).first()
            if found is not None:
                return int(found[0]) - 1, str(found[1])
        try:
            with Session(self._engine) as session, session.begin():
                session.add(
                    RegisteredModelRow(
                        name=name,
                        owner=owner,
                        readers=list(readers),
                        created_at=self._clock(),
                        next_version=2,
                    )
                )
            return 1, owner
        except IntegrityError:  # created a moment ago by another caller
            return self.reserve_version(name, owner=owner, readers=readers)

    def add_version(self, version: ModelVersion) -> ModelVersion:
        """Store `version`, whose number `reserve_version` handed out."""
        with Session(self._engine) as session, session.begin():
            row = _model_row(session, version.model)
            session.add(
                ModelVersionRow(
                    model_id=row.id,
                    version=version.version,
                    job_id=version.job_id,
                    attempt=version.attempt,
                    step=version.step,
                    spec=version.spec,
                    metrics=version.metrics,
                    files=[_file_json(f) for f in version.files],
                    created_by=version.created_by,
                    created_at=self._clock(),
                )
            )
        return self.version(version.model, str(version.version))

    def version(self, name: str, ref: str) -> ModelVersion:
        """Version `ref` of `name`: a number, or an alias on one. ModelNotFound."""
        with Session(self._engine) as session:
            row = _model_row(session, name)
            number = _resolve(session, row, ref)
            found = session.scalar(
                select(ModelVersionRow).where(
                    ModelVersionRow.model_id == row.id, ModelVersionRow.version == number
                )
            )
            if found is None:
                raise ModelNotFound(f"model {name!r} has no version {ref}")
            return _version(name, found)

    def set_alias(self, name: str, alias: str, version: int) -> None:
        with Session(self._engine) as session, session.begin():
            row = _model_row(session, name, lock=True)  # against `delete_unnamed_version`
            exists = session.scalar(
                select(ModelVersionRow.id).where(
                    ModelVersionRow.model_id == row.id, ModelVersionRow.version == version
                )
            )
            if exists is None:
                raise ModelNotFound(f"model {name!r} has no version {version}")
            session.merge(ModelAliasRow(model_id=row.id, alias=alias, version=version))

    def remove_alias(self, name: str, alias: str) -> None:
        with Session(self._engine) as session, session.begin():
            row = _model_row(session, name)
            gone = session.execute(
                delete(ModelAliasRow).where(
                    ModelAliasRow.model_id == row.id, ModelAliasRow.alias == alias
                )
            )
            if not getattr(gone, "rowcount", 0):
                raise ModelNotFound(f"model {name!r} has no alias {alias!r}")

    def set_readers(self, name: str, readers: Sequence[str]) -> None:
        with Session(self._engine) as session, session.begin():
            _model_row(session, name).readers = list(readers)

    def delete_version(self, name: str, version: int) -> None:
        """The version's row and the aliases on it (its files are the caller's to
        remove). The model's row stays, with its name and its numbers."""
        with Session(self._engine) as session, session.begin():
            row = _model_row(session, name)
            gone = session.execute(
                delete(ModelVersionRow).where(
                    ModelVersionRow.model_id == row.id, ModelVersionRow.version == version
                )
            )
            if not getattr(gone, "rowcount", 0):
                raise ModelNotFound(f"model {name!r} has no version {version}")
            session.execute(
                delete(ModelAliasRow).where(
                    ModelAliasRow.model_id == row.id, ModelAliasRow.version == version
                )
            )

    def owner_bytes(self, owner: str) -> int:
        """What the versions of `owner`'s models hold, in bytes (their quota's use)."""
        query = (
            select(ModelVersionRow.files)
            .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
            .where(RegisteredModelRow.owner == owner)
        )
        with Session(self._engine) as session:
            return sum(int(f["bytes"]) for files in session.scalars(query) for f in files)

    def unnamed_versions(self, *, before: datetime) -> list[ModelVersion]:
        """Versions registered before `before` that no alias points at and that are not
        their model's newest: what retention may delete (`model_retention`)."""
        query = (
            select(RegisteredModelRow.name, ModelVersionRow)
            .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
            .where(_unnamed(before))
            .order_by(ModelVersionRow.id)
        )
        with Session(self._engine) as session:
            return [_version(name, row) for name, row in session.execute(query)]

    def delete_unnamed_version(self, name: str, version: int, *, before: datetime) -> bool:
        """Delete the version's row if it is still unnamed (no alias, not the newest,
        older than `before`), under the model's row lock that `set_alias` takes too, so
        an alias set meanwhile keeps it. False when it no longer qualifies."""
        with Session(self._engine) as session, session.begin():
            row = _model_row(session, name, lock=True)
            gone = session.execute(
                delete(ModelVersionRow)
                .where(
                    ModelVersionRow.model_id == row.id,
                    ModelVersionRow.version == version,
                    _unnamed(before),
                )
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(gone, "rowcount", 0))

    def versions_of_job(self, job_id: int) -> list[ModelVersion]:
        """Lineage: the versions made from job `job_id`'s checkpoints."""
        query = (
            select(RegisteredModelRow.name, ModelVersionRow)
            .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
            .where(ModelVersionRow.job_id == job_id)
            .order_by(ModelVersionRow.id)
        )
        with Session(self._engine) as session:
            return [_version(name, row) for name, row in session.execute(query)]


def _unnamed(before: datetime) -> ColumnElement[bool]:
    """A version row older than `before`, with no alias on it, below its model's newest."""
    newer = aliased(ModelVersionRow)
    newest_above = select(newer.id).where(
        newer.model_id == ModelVersionRow.model_id, newer.version > ModelVersionRow.version
    )
    named = select(ModelAliasRow.version).where(
        ModelAliasRow.model_id == ModelVersionRow.model_id,
        ModelAliasRow.version == ModelVersionRow.version,
    )
    return and_(ModelVersionRow.created_at < before, newest_above.exists(), ~named.exists())


def _model_row(session: Session, name: str, *, lock: bool = False) -> RegisteredModelRow:
    """The model's row; with `lock`, held until the transaction ends (PostgreSQL: FOR
    UPDATE; SQLite serializes writers anyway)."""
    query = select(RegisteredModelRow).where(RegisteredModelRow.name == name)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise ModelNotFound(f"no model {name!r}")
    return row


def _resolve(session: Session, model: RegisteredModelRow, ref: str) -> int:
    if ref.isdigit():
        if len(ref) > 10 or int(ref) > MAX_VERSION:
            raise ModelNotFound(f"model {model.name!r} has no version {ref}")
        return int(ref)
    number = session.scalar(
        select(ModelAliasRow.version).where(
            ModelAliasRow.model_id == model.id, ModelAliasRow.alias == ref
        )
    )
    if number is None:
        raise ModelNotFound(f"model {model.name!r} has no alias {ref!r}")
    return number


def _model(
    row: RegisteredModelRow, versions: tuple[ModelVersion, ...], aliases: dict[str, int]
) -> RegisteredModel:
    return RegisteredModel(
        row.name, row.owner, tuple(row.readers), row.created_at, versions, aliases
    )


def _version(name: str, row: ModelVersionRow) -> ModelVersion:
    files = tuple(FileDigest(str(f["path"]), int(f["bytes"]), str(f["sha256"])) for f in row.files)
    return ModelVersion(
        name,
        row.version,
        row.job_id,
        row.attempt,
        row.step,
        dict(row.spec),
        dict(row.metrics),
        files,
        row.created_by,
        row.created_at,
    )


def _file_json(digest: FileDigest) -> dict[str, Any]:
    return {"path": digest.path, "bytes": digest.bytes, "sha256": digest.sha256}
