"""What a rank tells the runtime about a stop: whether its entrypoint was ever told. An
entrypoint that returns without being told finished its work, even while a preemption
notice was on its way (the loop then records SUCCEEDED instead of running it again)."""

from __future__ import annotations

import threading

from workers.context import RankContext, RankInfo

INFO = RankInfo(rank=0, world_size=1, local_rank=0, dp=1, tp=1, pp=1)


def test_a_stop_counts_as_seen_only_once_the_entrypoint_asked() -> None:
    stop = threading.Event()
    ctx = RankContext(INFO, stop)
    assert ctx.should_stop() is False and ctx.stop_seen is False
    stop.set()
    assert ctx.stop_seen is False  # the notice came; the entrypoint has not looked yet
    assert ctx.should_stop() is True and ctx.stop_seen is True
