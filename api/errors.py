"""One JSON error shape everywhere: `{"error": {code, message, field}, "errors": [...]}`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.auth import Forbidden, Unauthorized
from gangway.models import ErrorBody, ErrorDetail, field_path
from scheduler.store import (
    ApiKeyNotFound,
    IllegalTransition,
    JobEnded,
    JobNotFound,
    KeyReused,
    QueueNotFound,
    StaleState,
    UserExists,
    UserNotFound,
)
from scheduler.store.model_files import TamperedFile
from scheduler.store.pipelines import PipelineNotFound
from scheduler.store.registry import ModelNotFound, QuotaExceeded
from scheduler.store.sweeps import SweepNotFound


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at `path`. Starlette's own 405 names only the first
    route that matched the path, and routes here are one per method."""
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(path):
            methods |= route.methods or set()
    return sorted(methods)


class FieldError(ValueError):
    """A request that parses but cannot be accepted; `field` is a dotted path into the body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


class TooManyRequests(RuntimeError):
    """The caller holds as much of something as it may (a 429); the message says what."""

    retry_after_s = 5


DATABASE_RETRY_S = 5


class StoreUnavailable(RuntimeError):
    """Storage named by a URL (GANGWAY_STORAGE_URL) could not be read just now."""


def error_response(
    status_code: int, details: Sequence[ErrorDetail], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=details[0], errors=list(details))
    return JSONResponse(
        status_code=status_code, content=body.model_dump(mode="json"), headers=headers
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            ErrorDetail(
                code="validation_error", message=e["msg"], field=field_path(e["loc"]) or None
            )
            for e in exc.errors()
        ]
        return error_response(422, details)

    @app.exception_handler(FieldError)
    async def _field(_: Request, exc: FieldError) -> JSONResponse:
        return error_response(
            422, [ErrorDetail(code="validation_error", message=exc.message, field=exc.field)]
        )

    @app.exception_handler(Unauthorized)
    async def _unauthorized(_: Request, exc: Unauthorized) -> JSONResponse:
        detail = ErrorDetail(code="unauthorized", message=str(exc), field="Authorization")
        return error_response(401, [detail], headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden) -> JSONResponse:
        detail = ErrorDetail(code="forbidden", message=str(exc), field=exc.field)
        return error_response(403, [detail])

    @app.exception_handler(JobNotFound)
    @app.exception_handler(UserNotFound)
    @app.exception_handler(ApiKeyNotFound)
    @app.exception_handler(QueueNotFound)
    @app.exception_handler(ModelNotFound)
    @app.exception_handler(PipelineNotFound)
    @app.exception_handler(SweepNotFound)
    async def _not_found(_: Request, exc: Exception) -> JSONResponse:
        return error_response(404, [ErrorDetail(code="not_found", message=str(exc))])

    @app.exception_handler(IllegalTransition)
    @app.exception_handler(JobEnded)
    @app.exception_handler(StaleState)
    @app.exception_handler(UserExists)
    @app.exception_handler(QuotaExceeded)
    @app.exception_handler(TamperedFile)
    async def _conflict(_: Request, exc: Exception) -> JSONResponse:
        return error_response(409, [ErrorDetail(code="conflict", message=str(exc))])

    @app.exception_handler(KeyReused)
    async def _key_reused(_: Request, exc: KeyReused) -> JSONResponse:
        detail = ErrorDetail(
            code="idempotency_key_reused", message=str(exc), field="Idempotency-Key"
        )
        return error_response(409, [detail])

    @app.exception_handler(TooManyRequests)
    async def _too_many(_: Request, exc: TooManyRequests) -> JSONResponse:
        detail = ErrorDetail(code="too_many_requests", message=str(exc))
        return error_response(429, [detail], headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "http_error"
        detail = ErrorDetail(code=code, message=str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request.url.path))
        return error_response(exc.status_code, [detail], headers=headers)

    @app.exception_handler(DBAPIError)
    async def _database(_: Request, exc: DBAPIError) -> JSONResponse:
        """The database cannot be reached (a partition, a restart, a failover): the
        request may be retried as it was; anything else the database said is a bug."""
        if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
            return _internal_error(exc)
        message = "the service cannot reach its database just now; try again shortly"
        detail = ErrorDetail(code="database_unavailable", message=message)
        return error_response(503, [detail], headers={"Retry-After": str(DATABASE_RETRY_S)})

    @app.exception_handler(StoreUnavailable)
    async def _store(_: Request, exc: StoreUnavailable) -> JSONResponse:
        detail = ErrorDetail(code="storage_unavailable", message=str(exc))
        return error_response(503, [detail], headers={"Retry-After": str(DATABASE_RETRY_S)})

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return _internal_error(exc)


def _internal_error(exc: Exception) -> JSONResponse:
    message = f"internal error ({type(exc).__name__}); see the service log"
    return error_response(500, [ErrorDetail(code="internal", message=message)])
