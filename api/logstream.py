"""`GET /v1/jobs/{id}/logs/stream`: a job's output as Server-Sent Events, while it runs.

Each stored line is one `line` event whose `id` is the line's cursor, so a client that
reconnects with `Last-Event-ID` reads on without a gap or a repeat; when the job has
ended and every line is out, an `end` event carries its final state and the stream
closes. The store is polled (it is the only place lines arrive: the scheduler loop writes
them), twice a second, with a comment line every 15 s so proxies keep the connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.auth import current_caller
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

POLL_S = 0.5
KEEPALIVE_S = 15.0
BATCH = 1000


@router.get(
    "/v1/jobs/{job_id}/logs/stream",
    response_class=StreamingResponse,
    responses={
        **ERROR_RESPONSES,
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
    *,
    rank: Annotated[int | None, Query(ge=0, le=MAX_ID, description="one rank only")] = None,
    tail: Annotated[int, Query(ge=0, le=10_000, description="start with the last N lines")] = 200,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=0, le=2**63 - 1, description="resume after it"),
    ] = None,
) -> StreamingResponse:
    await run_in_threadpool(repo.get, job_id)  # a 404 before the stream starts
    events = _events(repo, request, job_id, rank=rank, tail=tail, after=last_event_id)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _events(
    repo: JobRepository,
    request: Request,
    job_id: int,
    *,
    rank: int | None,
    tail: int,
    after: int | None,
) -> AsyncIterator[str]:
    if after is None:
        backlog = await run_in_threadpool(repo.logs, job_id, rank=rank, tail=tail)
        for line in backlog:
            yield _line_event(line)
        after = (
            backlog[-1].id if backlog else await run_in_threadpool(_newest_id, repo, job_id, rank)
        )
    quiet_since = time.monotonic()
    while not await request.is_disconnected():
        # The state first, the lines second: every line stored before the job ended is
        # read by the fetch that follows, so the end event never cuts one off.
        job = await run_in_threadpool(repo.get, job_id)
        lines = await run_in_threadpool(repo.logs, job_id, rank=rank, tail=BATCH, after=after)
        for line in lines:
            yield _line_event(line)
        if lines:
            after, quiet_since = lines[-1].id, time.monotonic()
            continue
        if job.state.is_terminal:
            yield f"event: end\ndata: {json.dumps({'state': job.state.value})}\n\n"
            return
        if time.monotonic() - quiet_since > KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(POLL_S)


def _newest_id(repo: JobRepository, job_id: int, rank: int | None) -> int:
    newest = repo.logs(job_id, rank=rank, tail=1)
    return newest[-1].id if newest else 0


def _line_event(line: LogLine) -> str:
    return f"id: {line.id}\nevent: line\ndata: {json.dumps(asdict(line))}\n\n"
