"""Fencing: proof, in every write, that the writer still holds the scheduler lease.

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
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.store.tables import LeaseRow


@dataclass(frozen=True)
class Fence:
    """The proof a leader writes with: the lease it took and the generation it got."""

    name: str
    holder: str
    generation: int


@dataclass
class FenceSlot:
    """The fence a loop writes under now: set when it takes the lease, cleared when it
    steps down. Its repository and executor read it at every write and action."""

    current: Fence | None = None

    def require(self) -> Fence:
        if self.current is None:
            raise Fenced(None, "this loop does not lead")
        return self.current


class Fenced(RuntimeError):
    """A write or action by a leader that no longer holds its lease's generation."""

    def __init__(self, fence: Fence | None, found: str) -> None:
        who = f"{fence.holder} (generation {fence.generation})" if fence else "a standby"
        super().__init__(f"{who} may not write: {found}")
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
