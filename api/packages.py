"""Working directories clients upload: `PUT /v1/packages/{sha256}` with the zip as the
body, `GET`/`HEAD` to ask whether the service has one.

A package is named by the sha256 of its bytes, so an upload is idempotent and a client
that finds its hash already stored sends nothing. The body is streamed to disk and hashed
on the way; past the size limit it is a 413, a body that does not hash to its name a 422.
Before it is kept its zip directory is read (`gangway.packaging.check_zip`): more bytes
unpacked or more entries than allowed is a 413, an entry that would land outside the
directory or as a symlink, or a body that is no zip, a 422.
These routes are exempt from the request-size limit of the rest of the API: this is the
one place that takes large bodies, with its own limit.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi import Path as PathParam

from api.auth import Caller, current_caller
from api.errors import error_response
from gangway.models import PACKAGE_ID, ErrorBody, ErrorDetail, PackageInfo
from gangway.packaging import ZipInvalid, ZipTooLarge
from scheduler.store.packages import (
    DigestMismatch,
    PackageRecord,
    PackageStore,
    PackageTooLarge,
)

PREFIX = "/v1/packages/"
# The setting that raises each of check_zip's limits, named in a refusal.
_SETTINGS = {
    "unpacked_bytes": "GANGWAY_PACKAGE_MAX_UNPACKED_BYTES",
    "files": "GANGWAY_PACKAGE_MAX_FILES",
}
router = APIRouter(dependencies=[Depends(current_caller)])
Sha256 = Annotated[str, PathParam(pattern=PACKAGE_ID, description="sha256 of the zip, hex")]
RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "auth is on and the API key is missing or wrong"},
    404: {"model": ErrorBody, "description": "no package with this hash"},
    413: {
        "model": ErrorBody,
        "description": "the package is over the size limit, or declares more bytes "
        "unpacked or more entries than allowed",
    },
    422: {
        "model": ErrorBody,
        "description": "the body's sha256 is not the one in the path, or the body is not a "
        "zip whose entries stay inside its directory (no absolute path, '..', backslash or "
        "symlink)",
    },
}


def packages(request: Request) -> PackageStore:
    store: PackageStore = request.app.state.packages
    return store


Packages = Annotated[PackageStore, Depends(packages)]


def _info(record: PackageRecord) -> PackageInfo:
    return PackageInfo(
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        created_at=record.created_at,
        last_used_at=record.last_used_at,
    )


def _not_found(sha256: str) -> Response:
    return error_response(
        404, [ErrorDetail(code="not_found", message=f"no package {sha256}", field="sha256")]
    )


@router.get(PREFIX + "{sha256}", response_model=PackageInfo, responses=RESPONSES)
@router.head(PREFIX + "{sha256}", response_model=None, responses=RESPONSES)
def get_package(sha256: Sha256, store: Packages) -> PackageInfo | Response:
    record = store.get(sha256)
    return _info(record) if record is not None else _not_found(sha256)


@router.put(
    PREFIX + "{sha256}",
    response_model=PackageInfo,
    responses={**RESPONSES, 201: {"model": PackageInfo, "description": "stored"}},
)
async def put_package(
    sha256: Sha256, request: Request, response: Response, caller: Caller, store: Packages
) -> PackageInfo | Response:
    """Store a zip under its sha256 (201), or find it stored already (200, body unread)."""
    limit: int = request.app.state.package_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return _too_large(limit)
    try:
        record, created = await store.put(
            sha256, request.stream(), owner=caller.name, max_bytes=limit
        )
    except PackageTooLarge:
        return _too_large(limit)
    except DigestMismatch as exc:
        detail = ErrorDetail(code="validation_error", message=str(exc), field="sha256")
        return error_response(422, [detail])
    except ZipTooLarge as exc:
        setting = _SETTINGS[exc.limit]
        detail = ErrorDetail(code="too_large", message=f"{exc} ({setting})", field="body")
        return error_response(413, [detail])
    except ZipInvalid as exc:
        detail = ErrorDetail(code="validation_error", message=str(exc), field="body")
        return error_response(422, [detail])
    response.status_code = 201 if created else 200
    return _info(record)


def _too_large(limit: int) -> Response:
    message = f"a package may hold at most {limit} bytes (GANGWAY_PACKAGE_MAX_BYTES)"
    return error_response(413, [ErrorDetail(code="too_large", message=message, field="body")])
