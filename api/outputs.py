"""A job's outputs: `GET /v1/jobs/{id}/outputs` lists what its ranks wrote to their
OUTPUTS_DIR (merged: each path once, from the lowest rank that has it; or one rank's),
`GET /v1/jobs/{id}/outputs/{path}` sends one file's bytes.

Outputs are the job's own, not the cluster's: with auth on only the job's owner and
admins may list or read them (a 403 naming `job_id` for anyone else), unlike the rest of
a job, which every caller may read. A path is checked (`gangway.paths`) before storage
is touched: absolute, `..`, NUL or empty components are a 422 naming `path`; a path no
listing shows (missing, a folder, a symlink, a copy in progress) is a 404 naming `path`.
What lives where, and what a listing shows, is `scheduler.store.outputs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, BinaryIO
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.convertors import PathConvertor, register_url_convertor

from api.auth import Caller, Principal, current_caller, require_owner
from api.convert import reading_the_store
from api.errors import FieldError, error_response
from api.pages import fitting
from api.routes import MAX_ID, JobId, Repo
from gangway.models import (
    ErrorBody,
    ErrorDetail,
    OutputFile,
    OutputsPage,
    OutputsUsage,
)
from gangway.paths import MAX_PATH_CHARS, BadPath, path_parts
from scheduler.store import JobRecord, JobRepository
from scheduler.store.output_stores import OutputsStorage
from scheduler.store.output_usage import is_settled, storage_usage
from scheduler.store.outputs import FoundOutput, OutputEntry, OutputsSlice, Parts


class AnyPath(PathConvertor):
    """Starlette's `path` convertor with newlines: its `.*` stops at one, so a file whose
    name holds one could not be asked for, and the route's `$`, which matches before a
    final newline, would hand `a` to a request for `a\n`."""

    regex = r"[\s\S]*"


register_url_convertor("anypath", AnyPath())

router = APIRouter(dependencies=[Depends(current_caller)])
OUTPUTS = "/v1/jobs/{job_id}/outputs"
RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "auth is on and the API key is missing or wrong"},
    403: {"model": ErrorBody, "description": "the caller is neither the job's owner nor an admin"},
    404: {"model": ErrorBody, "description": "no such job; for a file, none at `path`"},
    422: {"model": ErrorBody, "description": "invalid input; `error.field` names the field"},
}
Rank = Annotated[
    int | None,
    Query(ge=0, le=MAX_ID, description="one rank's files; default: the merged view"),
]


def _storage(request: Request) -> OutputsStorage | None:
    storage: OutputsStorage | None = request.app.state.outputs
    return storage


def _owned_job(job_id: int, caller: Principal, repo: JobRepository) -> JobRecord:
    job = repo.get(job_id)  # 404 for an unknown job
    require_owner(caller, job.user, f"job {job_id}", may="read its outputs", field="job_id")
    return job


def _parts(value: str, field: str) -> Parts:
    try:
        return path_parts(value)
    except BadPath as exc:
        raise FieldError(field, str(exc)) from exc


@router.get(OUTPUTS, response_model=OutputsPage, responses=RESPONSES)
def get_outputs(
    job_id: JobId,
    caller: Caller,
    *,
    repo: Repo,
    request: Request,
    rank: Rank = None,
    cursor: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_PATH_CHARS,
            description="next_cursor of the previous page (a path: the page starts after it)",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    """The job's output files sorted by path, a page at a time (a page also ends at
    GANGWAY_MAX_PAGE_BYTES of JSON), with what they take in storage and the owner's use
    of their quota. Files appear as the ranks' supervisors copy them: when a rank ends
    and at each checkpoint."""
    job = _owned_job(job_id, caller, repo)
    after = _parts(cursor, "cursor") if cursor is not None else ()
    storage = _storage(request)
    with reading_the_store("outputs"):
        if storage is None:  # an app that stores no outputs
            listed, total = OutputsSlice([], None), 0
        else:
            listed = storage.listing(job_id, rank=rank, after=after, limit=limit)
            settled = is_settled(job.finished_at, repo.now())
            total = storage.job_bytes(job_id, settled=settled)
        usage = _usage(request, repo, storage, job.user) if cursor is None else None
    files, next_cursor = _page(listed, request.app.state.limits.max_page_bytes)
    page = OutputsPage(files=files, next_cursor=next_cursor, total_bytes=total, usage=usage)
    return Response(page.model_dump_json(), media_type="application/json")


def _usage(
    request: Request, repo: JobRepository, storage: OutputsStorage | None, user: str
) -> OutputsUsage:
    """The owner's use of their storage: one stat or walk per job of theirs (see
    `scheduler.store.output_usage`), so only the first page of a listing pays it."""
    quota: int = request.app.state.storage_quota_bytes
    use = storage_usage(
        repo, request.app.state.registry, storage, user, quota_bytes=quota, now=repo.now()
    )
    return OutputsUsage(
        user=user, used_bytes=use.used_bytes, model_bytes=use.model_bytes, quota_bytes=quota
    )


def _page(listed: OutputsSlice, max_bytes: int) -> tuple[list[OutputFile], str | None]:
    """The slice's files as sent: cut where the page's JSON would pass `max_bytes`."""
    if not listed.files:
        return [], None
    kept, cut = fitting((_wire(e) for e in listed.files), max_bytes)
    files = [file for file, _ in kept]
    return files, files[-1].path if cut else listed.next_cursor


def _wire(entry: OutputEntry) -> OutputFile:
    return OutputFile(
        path=entry.path, bytes=entry.bytes, rank=entry.rank, modified_at=entry.modified_at
    )


@router.get(
    OUTPUTS + "/{path:anypath}",
    response_class=FileResponse,
    responses={
        **RESPONSES,
        200: {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
            "description": "the file's bytes; Content-Disposition names it",
            "headers": {
                "X-Gangway-Rank": {
                    "schema": {"type": "integer"},
                    "description": "the rank whose copy was sent",
                }
            },
        },
    },
)
def get_output_file(
    job_id: JobId,
    path: Annotated[
        str,
        PathParam(
            max_length=MAX_PATH_CHARS,
            description="a path the listing shows, relative to the job's outputs",
        ),
    ],
    caller: Caller,
    *,
    repo: Repo,
    request: Request,
    rank: Rank = None,
) -> Response:
    """One output file: the merged view's (the lowest rank that has `path`), or rank
    `rank`'s. Only what a listing shows is sent: never a symlink or what is under one,
    a folder, or a copy still in progress."""
    _owned_job(job_id, caller, repo)
    parts = _parts(path, "path")
    storage = _storage(request)
    with reading_the_store("outputs"):
        found = storage.find(job_id, parts, rank=rank) if storage else None
    if found is None:
        where = f"rank {rank}'s" if rank is not None else "the"
        message = f"job {job_id} has no file {path!r} in {where} outputs"
        return error_response(404, [ErrorDetail(code="not_found", message=message, field="path")])
    headers = {
        "Content-Disposition": content_disposition(parts[-1]),
        "X-Gangway-Rank": str(found.entry.rank),
    }
    if isinstance(found, FoundOutput):
        return FileResponse(
            found.path,
            media_type="application/octet-stream",
            stat_result=found.stat,
            headers=headers,
        )
    with reading_the_store("outputs"):
        opened = found.open()
    size = getattr(opened, "size", None)  # the object opened: it may be newer than listed
    if isinstance(size, int):
        headers["Content-Length"] = str(size)
    return StreamingResponse(
        _chunks(opened),
        media_type="application/octet-stream",
        headers=headers,
        background=BackgroundTask(opened.close),  # also when the body was never read
    )


def _chunks(opened: BinaryIO) -> Iterator[bytes]:
    """A stored file's bytes, a megabyte at a time; closed when sent or abandoned."""
    with opened:
        while chunk := opened.read(1 << 20):
            yield chunk


def content_disposition(name: str) -> str:
    """`attachment` with the file's name twice: plain ASCII with anything that could
    break the header or a shell (quotes, control characters, separators) replaced, and
    the exact name percent-encoded (RFC 6266's `filename*`) for clients that read it."""
    plain = "".join(c if c.isascii() and (c.isalnum() or c in "._-+") else "_" for c in name)
    return f"attachment; filename=\"{plain or 'output'}\"; filename*=UTF-8''{quote(name, safe='')}"
