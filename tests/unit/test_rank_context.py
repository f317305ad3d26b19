"""What a rank tells the runtime: whether its entrypoint was ever told of a stop (one
that returns without being told finished its work, even while a preemption notice was on
its way: the loop then records SUCCEEDED instead of running it again), and its event
lines for the job's timeline."""

from __future__ import annotations

import threading

from workers.launch import RankInfo
from workers.program.context import MAX_EVENT_CHARS, MAX_EVENTS, RankContext

INFO = RankInfo(rank=0, world_size=1, local_rank=0, dp=1, tp=1, pp=1)


def test_a_stop_counts_as_seen_only_once_the_entrypoint_asked() -> None:
    stop = threading.Event()
    ctx = RankContext(INFO, stop)
    assert ctx.should_stop() is False and ctx.stop_seen is False
    stop.set()
    assert ctx.stop_seen is False  # the notice came; the entrypoint has not looked yet
    assert ctx.should_stop() is True and ctx.stop_seen is True


def test_event_lines_are_bounded_in_count_and_length() -> None:
    """A job's code may call `event` in a loop: the timeline gets the first lines only."""
    ctx = RankContext(INFO, threading.Event())
    ctx.event("x" * (MAX_EVENT_CHARS + 10))
    for n in range(2 * MAX_EVENTS):
        ctx.event(f"line {n}")
    events = ctx.events()
    assert len(events) == MAX_EVENTS
    assert events[0] == "x" * MAX_EVENT_CHARS and events[1] == "line 0"
