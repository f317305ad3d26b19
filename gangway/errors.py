"""Typed SDK errors.

GangwayError
├── TransportError        the server could not be reached
├── APIError              the server answered with an error body
│   ├── Unauthorized      401 (no API key, or a wrong or revoked one)
│   ├── Forbidden         403 (the key's role does not allow it)
│   ├── NotFound          404
│   ├── Conflict          409
│   └── ValidationFailed  422 (`.field` names the offending field)
├── JobFailed             wait(): the job ended FAILED or CANCELLED
└── WaitTimeout           wait(): the job did not end in time
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gangway.models import field_path


class GangwayError(Exception):
    pass


class TransportError(GangwayError):
    pass


class APIError(GangwayError):
    def __init__(self, status_code: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(
            f"{status_code} {code}: {message}" + (f" (field: {field})" if field else "")
        )
        self.status_code, self.code, self.message, self.field = status_code, code, message, field


class Unauthorized(APIError):
    pass


class Forbidden(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class ValidationFailed(APIError):
    pass


class Unavailable(APIError):
    """503: the service cannot answer just now (its database is unreachable); the same
    request may be retried."""


class JobFailed(GangwayError):
    def __init__(self, job: Any) -> None:
        super().__init__(f"job {job.id} ended {job.state}: {job.error or job.status_reason}")
        self.job = job


class WaitTimeout(GangwayError):
    pass


def error_for_status(status_code: int, code: str, message: str, field: str | None) -> APIError:
    cls = {
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        422: ValidationFailed,
        503: Unavailable,
    }.get(status_code, APIError)
    return cls(status_code, code, message, field)


def validation_failed(exc: ValidationError) -> APIError:
    """What the server would answer for a body pydantic rejects here, before any request:
    a 422 naming the first field."""
    first = exc.errors()[0]
    return error_for_status(422, "validation_error", first["msg"], field_path(first["loc"]))
