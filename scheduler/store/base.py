"""What every repository over the jobs database shares: the engine and the clock that
stamps rows. One convention for transactions: a read opens `Session(engine)`, a write
`Session(engine)` + `session.begin()` + `self._guard(session)`, one transaction per
public method. A repository with a `fence` (the scheduler leader's, see `fenced`) checks
it in the transaction of every write the loop makes, so a leader that lost its lease
changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Self

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from scheduler.store.fencing import FenceSlot, check_fence


def utcnow() -> datetime:
    return datetime.now(UTC)


class Repository:
    """`clock` stamps every row; the simulator and tests pass their own."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], datetime] = utcnow,
        fence: FenceSlot | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._fence = fence

    @property
    def engine(self) -> Engine:
        """For the other repositories over the same database (accounts, queues)."""
        return self._engine

    def now(self) -> datetime:
        """The time this repository stamps rows with (tests pass their own clock)."""
        return self._clock()

    def with_clock(self, clock: Callable[[], datetime]) -> Self:
        return type(self)(self._engine, clock=clock, fence=self._fence)

    def fenced(self, fence: FenceSlot) -> Self:
        """This repository, writing only under `fence.current` (`Fenced` otherwise)."""
        return type(self)(self._engine, clock=self._clock, fence=fence)

    @property
    def generation(self) -> int | None:
        """The lease generation this repository writes under (None: not fenced)."""
        current = self._fence.current if self._fence is not None else None
        return current.generation if current is not None else None

    def _guard(self, session: Session) -> None:
        if self._fence is not None:
            check_fence(session, self._fence.require())
