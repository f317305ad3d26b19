"""Named leases: the leader lease one scheduling loop holds per database."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.store.base import Repository
from scheduler.store.tables import LeaseRow


class LeaseStore(Repository):
    def hold_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew lease `name` for `holder` until now + `ttl_s`; False while another
        holder's is unexpired. One conditional UPDATE (or the very first INSERT), so two
        services racing for it cannot both win, on SQLite or PostgreSQL."""
        now = self._clock()
        until = now + timedelta(seconds=ttl_s)
        with Session(self._engine) as session, session.begin():
            result = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == name,
                    (LeaseRow.holder == holder) | (LeaseRow.expires_at < now),
                )
                .values(holder=holder, expires_at=until)
            )
            if result.rowcount == 1:  # type: ignore[attr-defined]
                return True
            if session.get(LeaseRow, name) is not None:
                return False
        try:
            with Session(self._engine) as session, session.begin():
                session.add(LeaseRow(name=name, holder=holder, expires_at=until))
        except IntegrityError:  # another holder inserted it first
            return False
        return True

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up now (if `holder` has it), so a standby need not wait it out."""
        with Session(self._engine) as session, session.begin():
            session.execute(
                delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder)
            )
