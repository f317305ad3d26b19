"""What every repository over the jobs database shares: the engine and the clock that
stamps rows. One convention for transactions: a read opens `Session(engine)`, a write
`Session(engine)` + `session.begin()`, one transaction per public method."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Self

from sqlalchemy import Engine


def utcnow() -> datetime:
    return datetime.now(UTC)


class Repository:
    """`clock` stamps every row; the simulator and tests pass their own."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    @property
    def engine(self) -> Engine:
        """For the other repositories over the same database (accounts, queues)."""
        return self._engine

    def now(self) -> datetime:
        """The time this repository stamps rows with (tests pass their own clock)."""
        return self._clock()

    def with_clock(self, clock: Callable[[], datetime]) -> Self:
        return type(self)(self._engine, clock=clock)
