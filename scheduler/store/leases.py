"""Named leases: the leader lease one scheduling loop holds per database, with the
generation its writes are fenced with (`scheduler.store.fencing`)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import case, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.store.base import Repository
from scheduler.store.fencing import Fence, check_fence, database_now
from scheduler.store.tables import LeaseRow


class LeaseStore(Repository):
    """Leases are timed by the database's clock, never this repository's `clock`: two
    services need not agree on the time."""

    def hold_lease(self, name: str, holder: str, ttl_s: float) -> Fence | None:
        """Take or renew lease `name` for `holder` until the database's now + `ttl_s`.
        Returns the fence to write with (the generation grows when the holder changes),
        or None while another holder's lease is unexpired. One conditional UPDATE (or
        the very first INSERT), so two services racing for it cannot both win."""
        with Session(self._engine) as session, session.begin():
            now = database_now(session)
            taken = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == name,
                    (LeaseRow.holder == holder) | (LeaseRow.expires_at < now),
                )
                .values(
                    holder=holder,
                    expires_at=now + timedelta(seconds=ttl_s),
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

    def extend_lease(self, fence: Fence, ttl_s: float) -> bool:
        """Extend `fence`'s lease to the database's now + `ttl_s` if it is still
        unexpired and of that holder and generation; never takes a lease. True if so."""
        with Session(self._engine) as session, session.begin():
            now = database_now(session)
            extended = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == fence.name,
                    LeaseRow.holder == fence.holder,
                    LeaseRow.generation == fence.generation,
                    LeaseRow.expires_at > now,
                )
                .values(expires_at=now + timedelta(seconds=ttl_s))
            )
            return bool(extended.rowcount)  # type: ignore[attr-defined]

    def check_lease(self, fence: Fence, *, valid_for_s: float = 0.0) -> None:
        """`check_fence` in a transaction of its own: before an action outside the
        database (a Ray call), which must end within `valid_for_s`."""
        with Session(self._engine) as session, session.begin():
            check_fence(session, fence, valid_for_s=valid_for_s)

    def release_lease(self, fence: Fence) -> None:
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
