"""Queue quotas and members as admins set them. The scheduler loop reads the quotas at
every pass, so a change through the API applies within one pass, without a restart.

Members are who a queue is for: a queue without members takes every user's jobs (the
default, as before members existed); one with members takes only theirs (and admins'),
and they are the team that reads a model shared with `queue:<name>`. Only admins set
them, so submitting to a queue makes no one a member."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.orm import Session

from scheduler.model import QueueQuota
from scheduler.store.accounts import ADMIN_ROLE
from scheduler.store.base import utcnow
from scheduler.store.tables import QueueMemberRow, QueueRow, UserRow


def _quota(row: QueueRow) -> QueueQuota:
    return QueueQuota(row.guaranteed_gpus, row.borrow_limit_gpus, row.weight)


def _write(row: QueueRow, quota: QueueQuota) -> None:
    row.guaranteed_gpus = quota.guaranteed_gpus
    row.borrow_limit_gpus = quota.borrow_limit_gpus
    row.weight = quota.weight


class QueueNotFound(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} has no quota to delete")
        self.name = name


class QueueRepository:
    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def quotas(self) -> dict[str, QueueQuota]:
        with Session(self._engine) as session:
            rows = session.scalars(select(QueueRow).order_by(QueueRow.name))
            return {row.name: _quota(row) for row in rows}

    def put(self, name: str, quota: QueueQuota) -> bool:
        """Create or replace queue `name`'s quota; True if it was created."""
        with Session(self._engine) as session, session.begin():
            row = session.get(QueueRow, name)
            created = row is None
            if row is None:
                row = QueueRow(name=name)
                session.add(row)
            _write(row, quota)
            row.updated_at = self._clock()
        return created

    def seed(self, quotas: Mapping[str, QueueQuota]) -> list[str]:
        """Create the queues the settings name that the database lacks (a queue changed
        through the API keeps its change across restarts); returns those created."""
        existing = self.quotas()
        missing = [name for name in quotas if name not in existing]
        for name in missing:
            self.put(name, quotas[name])
        return missing

    def delete(self, name: str) -> None:
        """Forget the quota: the queue's jobs keep running and queueing, with no guarantee
        and no borrowing limit (as any queue nobody configured)."""
        with Session(self._engine) as session, session.begin():
            result = session.execute(delete(QueueRow).where(QueueRow.name == name))
            if not result.rowcount:  # type: ignore[attr-defined]
                raise QueueNotFound(name)

    def members(self) -> dict[str, tuple[str, ...]]:
        """Each queue that has members -> its members, by name."""
        with Session(self._engine) as session:
            rows = session.execute(
                select(QueueMemberRow.queue, QueueMemberRow.user).order_by(
                    QueueMemberRow.queue, QueueMemberRow.user
                )
            )
            found: dict[str, list[str]] = {}
            for queue, user in rows:
                found.setdefault(queue, []).append(user)
            return {queue: tuple(users) for queue, users in found.items()}

    def members_of(self, queue: str) -> tuple[str, ...]:
        """The queue's members; () for a queue open to every user."""
        with Session(self._engine) as session:
            rows = session.scalars(
                select(QueueMemberRow.user)
                .where(QueueMemberRow.queue == queue)
                .order_by(QueueMemberRow.user)
            )
            return tuple(rows)

    def admits(self, queue: str, owner: str) -> bool:
        """Whether a job of `owner`'s may go into `queue`: an open queue takes anyone's;
        one with members takes its members', and admins' (a user with the admin role, or
        a name no account has: the bootstrap admin, or anyone with auth off)."""
        members = self.members_of(queue)
        if not members or owner in members:
            return True
        with Session(self._engine) as session:
            role = session.scalar(select(UserRow.role).where(UserRow.name == owner))
        return role is None or role == ADMIN_ROLE

    def queues_of(self, user: str) -> frozenset[str]:
        """The queues `user` is a member of."""
        with Session(self._engine) as session:
            rows = session.scalars(select(QueueMemberRow.queue).where(QueueMemberRow.user == user))
            return frozenset(rows)

    def set_members(self, queue: str, users: Iterable[str]) -> None:
        """Replace the queue's members (none: open the queue to every user again)."""
        with Session(self._engine) as session, session.begin():
            session.execute(delete(QueueMemberRow).where(QueueMemberRow.queue == queue))
            rows = [{"queue": queue, "user": user} for user in sorted(set(users))]
            if rows:
                session.execute(insert(QueueMemberRow), rows)
