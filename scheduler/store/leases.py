"""Leases with fencing: who may act as the scheduler, and proof of it in every write.

A lease alone does not stop two leaders: a leader paused past its TTL (a GC pause, a
frozen VM, a slow Ray call) wakes up believing it still leads. So the lease row carries a
`generation`, one more on every change of holder, and the leader's writes carry a `Fence`
(holder, generation) that `check_fence` verifies inside the same transaction as the
write: with `SELECT ... FOR SHARE` on PostgreSQL, so a takeover (an UPDATE of that row)
waits for writes in flight and every later write of the old leader fails with `Fenced`.
On SQLite the database has one writer at a time, and a transaction that read the old row
cannot commit a write after a newer one (WAL snapshot), so the same check holds.

Expiry is judged by the database's clock (`database_now`), never the hosts': two
services need not agree on the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.store.tables import LeaseRow


@dataclass(frozen=True)
class Fence:
    """The proof a leader writes with: the lease it took and the generation it got."""

    name: str
    holder: str
    generation: int


class Fenced(RuntimeError):
    """A write or action by a leader that no longer holds its lease's generation."""

    def __init__(self, fence: Fence, found: str) -> None:
        super().__init__(
            f"{fence.holder} (generation {fence.generation}) no longer leads {fence.name!r}: "
            f"{found}"
        )
        self.fence = fence


def database_now(session: Session) -> datetime:
    """The database server's current time, UTC-aware (milliseconds on SQLite)."""
    if session.get_bind().dialect.name == "sqlite":
        text = session.scalar(select(func.strftime("%Y-%m-%d %H:%M:%f", "now")))
        return datetime.fromisoformat(str(text)).replace(tzinfo=UTC)
    value = session.scalar(select(func.clock_timestamp()))
    assert isinstance(value, datetime)
    return value.astimezone(UTC)


def check_fence(session: Session, fence: Fence, *, valid_for_s: float = 0.0) -> None:
    """Raise `Fenced` unless `fence` is the lease's current holder and generation, and
    (with `valid_for_s`) stays so for at least that long by the database's clock. Locks
    the lease row for share until the transaction ends (PostgreSQL), so no takeover
    commits between this check and the caller's write."""
    row = session.execute(
        select(LeaseRow.holder, LeaseRow.generation, LeaseRow.expires_at)
        .where(LeaseRow.name == fence.name)
        .with_for_update(read=True)
    ).one_or_none()
    if row is None:
        raise Fenced(fence, "the lease does not exist")
    if (row.holder, row.generation) != (fence.holder, fence.generation):
        raise Fenced(fence, f"held by {row.holder} at generation {row.generation}")
    if valid_for_s > 0:
        left = (row.expires_at - database_now(session)).total_seconds()
        if left < valid_for_s:
            raise Fenced(fence, f"it expires in {left:.1f} s (needs {valid_for_s:.1f} s)")


class LeaseStore:
    """Take, renew, check and release leases. Its own engine use, never fenced itself."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def hold(self, name: str, holder: str, ttl_s: float) -> Fence | None:
        """Take or renew lease `name` for `holder` until the database's now + `ttl_s`.
        Returns the fence to write with (the generation grows when the holder changes),
        or None while another holder's lease is unexpired. One conditional UPDATE (or
        the very first INSERT), so two services racing for it cannot both win."""
        with Session(self._engine) as session, session.begin():
            now = database_now(session)
            until = now + timedelta(seconds=ttl_s)
            taken = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == name,
                    (LeaseRow.holder == holder) | (LeaseRow.expires_at < now),
                )
                .values(
                    holder=holder,
                    expires_at=until,
                    generation=case(
                        (LeaseRow.holder == holder, LeaseRow.generation),
                        else_=LeaseRow.generation + 1,
                    ),
                )
                .returning(LeaseRow.generation)
            ).scalar_one_or_none()
            if taken is not None:
                return Fence(name, holder, int(taken))
            if session.get(LeaseRow, name) is not None:
                return None
        try:
            with Session(self._engine) as session, session.begin():
                until = database_now(session) + timedelta(seconds=ttl_s)
                session.add(LeaseRow(name=name, holder=holder, expires_at=until, generation=1))
        except IntegrityError:  # another holder inserted it first
            return None
        return Fence(name, holder, 1)

    def check(self, fence: Fence, *, valid_for_s: float = 0.0) -> None:
        """`check_fence` in a transaction of its own: before an action outside the
        database (a Ray call), which must finish within `valid_for_s`."""
        with Session(self._engine) as session, session.begin():
            check_fence(session, fence, valid_for_s=valid_for_s)

    def release(self, fence: Fence) -> None:
        """Let the lease expire now (if `fence` still holds it), so a standby need not
        wait it out. The row stays: its generation must keep growing."""
        with Session(self._engine) as session, session.begin():
            now = database_now(session)
            session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == fence.name,
                    LeaseRow.holder == fence.holder,
                    LeaseRow.generation == fence.generation,
                )
                .values(expires_at=now - timedelta(seconds=1))
            )
