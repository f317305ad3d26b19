"""`GET /v1/jobs/{id}/logs/stream`: a job's output as Server-Sent Events, while it runs.

Each stored line is one `line` event whose `id` is the line's cursor, so a client that
reconnects with `Last-Event-ID` reads on without a gap or a repeat; when the job has
ended and every line is out, an `end` event carries its final state and the stream
closes. The store is polled (it is the only place lines arrive: the scheduler loop writes
them) every `stream_poll_s`; sse-starlette does the framing, keep-alive pings and
disconnect handling. Each caller (API key, or client address without auth) may hold
`streams_per_caller` streams at once: one more is a 429, so a runaway client cannot
turn streams into a poll storm on the database.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from api.auth import Caller, current_caller
from api.errors import TooManyRequests
from api.limits import Limits
from api.routes import ERROR_RESPONSES, MAX_ID, JobId, Repo
from scheduler.store import JobRepository, LogLine

router = APIRouter(dependencies=[Depends(current_caller)])

# One event of the stream, as OpenAPI 3.2 and schemathesis read a text/event-stream.
_EVENT_SCHEMA = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["line", "end"]},
        "data": {
            "type": "string",
            "description": 'line: a LogLine as JSON; end: {"state": <the final state>}',
        },
        "id": {"type": "string", "description": "line events: the line's cursor"},
    },
}

KEEPALIVE_S = 15.0
BATCH = 1000


def _too_many(caller: str, limit: int) -> TooManyRequests:
    return TooManyRequests(
        f"{caller} already has {limit} log streams open (GANGWAY_STREAMS_PER_CALLER); "
        "close one, or read /logs with `after=` instead"
    )


class StreamSlots:
    """Open streams per caller. The event loop is the only user: no lock needed."""

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._open: Counter[str] = Counter()

    def take(self, caller: str) -> None:
        if self._open[caller] >= self.per_caller:
            raise _too_many(caller, self.per_caller)
        self._open[caller] += 1

    def give_back(self, caller: str) -> None:
        self._open[caller] -= 1
        if self._open[caller] <= 0:
            del self._open[caller]


class _HeldStream(EventSourceResponse):
    """An event stream that gives its caller's slot back however it ends."""

    def __init__(self, events: AsyncIterator[ServerSentEvent], slots: StreamSlots, who: str):
        super().__init__(events, ping=KEEPALIVE_S, headers={"Cache-Control": "no-cache"})
        self._slots, self._who = slots, who

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give_back(self._who)


@router.get(
    "/v1/jobs/{job_id}/logs/stream",
    response_class=EventSourceResponse,
    responses={
        **ERROR_RESPONSES,
        429: {"description": "the caller holds GANGWAY_STREAMS_PER_CALLER streams already"},
        200: {
            "content": {"text/event-stream": {"schema": _EVENT_SCHEMA}},
            "description": "`line` events (data: a LogLine as JSON; id: its cursor), then "
            "one `end` event with the job's final state",
        },
    },
)
async def stream_logs(
    job_id: JobId,
    repo: Repo,
    request: Request,
    caller: Caller,
    *,
    rank: Annotated[int | None, Query(ge=0, le=MAX_ID, description="one rank only")] = None,
    tail: Annotated[int, Query(ge=0, le=10_000, description="start with the last N lines")] = 200,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=0, le=2**63 - 1, description="resume after it"),
    ] = None,
) -> EventSourceResponse:
    await run_in_threadpool(repo.get, job_id)  # a 404 before the stream starts
    limits: Limits = request.app.state.limits
    slots: StreamSlots = request.app.state.streams
    who = caller.name if request.app.state.auth.required else _address(request)
    slots.take(who)
    events = _events(
        repo, job_id, rank=rank, tail=tail, after=last_event_id, poll_s=limits.stream_poll_s
    )
    return _HeldStream(events, slots, who)


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _events(
    repo: JobRepository,
    job_id: int,
    *,
    rank: int | None,
    tail: int,
    after: int | None,
    poll_s: float,
) -> AsyncIterator[ServerSentEvent]:
    """Disconnects end this generator from outside (sse-starlette cancels it)."""
    if after is None:
        backlog = await run_in_threadpool(repo.logs, job_id, rank=rank, tail=tail)
        for line in backlog:
            yield _line_event(line)
        after = (
            backlog[-1].id if backlog else await run_in_threadpool(_newest_id, repo, job_id, rank)
        )
    while True:
        # The state first, the lines second: every line stored before the job ended is
        # read by the fetch that follows, so the end event never cuts one off.
        job = await run_in_threadpool(repo.get, job_id)
        lines = await run_in_threadpool(repo.logs, job_id, rank=rank, tail=BATCH, after=after)
        for line in lines:
            yield _line_event(line)
        if lines:
            after = lines[-1].id
            continue
        if job.state.is_terminal:
            yield ServerSentEvent(event="end", data=json.dumps({"state": job.state.value}))
            return
        await asyncio.sleep(poll_s)


def _newest_id(repo: JobRepository, job_id: int, rank: int | None) -> int:
    newest = repo.logs(job_id, rank=rank, tail=1)
    return newest[-1].id if newest else 0


def _line_event(line: LogLine) -> ServerSentEvent:
    return ServerSentEvent(id=str(line.id), event="line", data=json.dumps(asdict(line)))
