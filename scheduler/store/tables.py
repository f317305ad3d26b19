"""Table definitions. Alembic migrations in `migrations/versions` create exactly these."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    case,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both backends (SQLite drops the zone on the way back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use UTC-aware datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        }
    )


class PipelineRow(Base):
    """Jobs submitted together, each a named step that may wait for and start from the
    steps before it. The jobs carry `pipeline_id`; this row names the group."""

    __tablename__ = "pipelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(100), index=True)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    queue: Mapped[str] = mapped_column(String(100), index=True)
    user: Mapped[str] = mapped_column(
        String(100), index=True, default="default", server_default="default"
    )
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20))  # indexed with id, version: see below
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    num_gpus: Mapped[int] = mapped_column(Integer)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    admitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    status_reason: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped (in SQL, so concurrent writers never share one) by every write to the row:
    # the loop's working set reloads a job only when its version moved.
    version: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    placement: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The running attempt's newest saved step and rank 0's measured step time: what a
    # preemption would lose (`views.run_info`).
    checkpoint_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_start_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    explanation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    preempt_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Scheduling history the policy ranks by (least attained service, starvation guard).
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    waited_s: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    attained_gpu_s: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    # Ranks of the current attempt flagged as slower than their peers ({rank, node_id,
    # local_s, ratio} each); cleared when the job is admitted again.
    stragglers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # A client's Idempotency-Key and a digest of the body it came with. Unique per user
    # (see __table_args__): one user's key never finds another user's job.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Why a pending job may not start until someone releases it (a sweep pauses a trial
    # here until it is promoted); None: not held.
    hold: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The pipeline it was submitted in (with its other steps, in one transaction), if any.
    pipeline_id: Mapped[int | None] = mapped_column(
        ForeignKey("pipelines.id", ondelete="SET NULL"), nullable=True, index=True
    )

    __table_args__ = (
        Index("ix_jobs_user_idempotency_key", "user", "idempotency_key", unique=True),
        # Covers the loop's (id, version) query per state (read from the index alone,
        # twice as fast at 12,000 jobs on SQLite) and every listing by state in id order.
        Index("ix_jobs_state_id_version", "state", "id", "version"),
    )


def fresh_versions(job_ids: Iterable[int]) -> dict[int, int]:
    """For bulk writes by a writer that keeps rows in memory (the loop's working set):
    job id -> the random 62-bit version its row gets if it still has the version the
    writer read (see `written_version`). Other writes count versions up, so a random one
    never meets them, and the writer can patch its copy to exactly what the row holds."""
    return {job_id: secrets.randbits(62) for job_id in job_ids}


def written_version(seen: BindParameter[int], fresh: BindParameter[int]) -> ColumnElement[int]:
    """The row's version after a write: `fresh` if it was still at `seen` (nothing else
    wrote since the writer read it), else counted up, so the writer's copy no longer
    matches and is read again. `seen` of -1 matches nothing (a plain write)."""
    return case((JobRow.version == seen, fresh), else_=JobRow.version + 1)


class JobDependencyRow(Base):
    """Job `job_id` waits for job `upstream_id` until `condition` holds. `waiting` until
    the condition held (`met_at`) or the job stopped waiting without it (cancelled); the
    loop reads only waiting rows, through a partial index, so the dependencies of jobs
    long gone cost its pass nothing."""

    __tablename__ = "job_dependencies"
    __table_args__ = (
        Index("ix_job_dependencies_upstream_id", "upstream_id"),
        Index(
            "ix_job_dependencies_waiting",
            "job_id",
            sqlite_where=text("waiting"),
            postgresql_where=text("waiting"),
        ),
    )

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    upstream_id: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    condition: Mapped[str] = mapped_column(String(16))
    waiting: Mapped[bool] = mapped_column(Boolean)
    met_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEventRow(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    from_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    to_state: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(Text)
    # The scheduler lease generation the change was written under (None: not the loop).
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)


class JobLogRow(Base):
    """One line a rank printed. `seq` numbers a rank's lines within an attempt.

    (job_id, id) serves readers (a tail, or the lines after a cursor) and retention;
    (job_id, attempt, rank, seq) finds a rank's newest line with one index probe."""

    __tablename__ = "job_logs"
    __table_args__ = (
        Index("ix_job_logs_job_id_id", "job_id", "id"),
        Index("ix_job_logs_job_id_attempt_rank_seq", "job_id", "attempt", "rank", "seq"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    line: Mapped[str] = mapped_column(Text)


class JobMetricRow(Base):
    """Training metrics as the loop saw them: one point per poll that found a new step."""

    __tablename__ = "job_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)  # retention by age
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Seconds in data-parallel collectives in the step, and their payload bytes (0014).
    comm_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    comm_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)


class LeaseRow(Base):
    """Who may act as the scheduler (one writer per database), until when."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # One more on every change of holder: a write fenced with an older one is refused.
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class NodeRow(Base):
    """The last cluster snapshot the scheduler loop saw; the API reads this, never Ray."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    num_gpus: Mapped[int] = mapped_column(Integer)
    num_cpus: Mapped[float] = mapped_column(Float)
    alive: Mapped[bool] = mapped_column(Boolean)
    rack: Mapped[str | None] = mapped_column(String(200), nullable=True)
    gpu_type: Mapped[str | None] = mapped_column(String(200), nullable=True)
    gpu_speed: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class UserRow(Base):
    """Someone who holds API keys: role `user` (changes only their own jobs) or `admin`."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True, index=True)
    role: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ApiKeyRow(Base):
    """An API key, kept as the SHA-256 of its secret: the secret is shown once, at issue."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    prefix: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class QueueRow(Base):
    """A queue's quota, as admins set it; the scheduler loop reads these every pass."""

    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    guaranteed_gpus: Mapped[int] = mapped_column(Integer)
    borrow_limit_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class QueueMemberRow(Base):
    """A user a queue is for. A queue with no rows is open to every user; one with rows
    takes jobs from its members only (and admins), and its members read the models
    shared with it (`queue:<name>` among a model's readers)."""

    __tablename__ = "queue_members"

    queue: Mapped[str] = mapped_column(String(100), primary_key=True)
    user: Mapped[str] = mapped_column(String(100), primary_key=True, index=True)


class PackageRow(Base):
    """A working directory a client uploaded: a zip named by its sha256, kept under the
    service's data directory while a job may still run it."""

    __tablename__ = "packages"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
