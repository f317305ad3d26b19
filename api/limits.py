"""Request limits every route shares, enforced before a route runs.

`RequestLimits` is one ASGI middleware: it counts a request body's bytes as they stream in
(a missing or lying Content-Length does not get past it) and answers 413 above the limit;
it refuses a JSON body nested deeper than `max_json_depth` arrays and objects with a 422,
counted on its text before anything parses it (json.loads and pydantic recurse: a few
hundred levels of `[` would otherwise end in a RecursionError, a 500); and it rejects text
no database can store faithfully: a NUL byte (PostgreSQL refuses it in text, SQLite would
silently keep it) or a lone UTF-16 surrogate (not encodable as UTF-8) in the path, the
query or a JSON body, with a 422 naming the field. Doing this once, ahead of routing,
covers every route and every free-form value (a function's `kwargs` too), identically on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from gangway.models import ErrorDetail
from gangway.packaging import DEFAULT_MAX_FILES, DEFAULT_MAX_UNPACKED_BYTES


@dataclass(frozen=True)
class Limits:
    """What the service accepts and returns (see Settings for the GANGWAY_* names): sizes,
    and whether requirement lines may carry pip options, URLs and paths."""

    max_body_bytes: int = 1024 * 1024
    max_json_depth: int = 64  # arrays and objects; room for kwargs around a job body
    exempt_prefixes: tuple[str, ...] = ("/v1/packages/",)  # uploads bound their own size
    max_page_bytes: int = 2 * 1024 * 1024
    streams_per_caller: int = 4
    stream_poll_s: float = 1.0
    # What an uploaded zip may unpack to, on every node that runs its job.
    package_max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
    package_max_files: int = DEFAULT_MAX_FILES
    requirements_allow_pip_options: bool = False


class _BodyTooLarge(Exception):
    pass


def invalid_text(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL byte (\\u0000), which text fields cannot hold"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which is not valid Unicode text"
    return None


# A JSON string (its escapes minded; an unterminated one runs to the end) or a bracket.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def _too_deep_at(body: bytes, limit: int) -> int | None:
    """The character offset where `body` opens more than `limit` nested arrays and
    objects, or None. One regex pass counting brackets outside strings: no parser and no
    recursion run before the depth is known to be safe for them, and the scan stops at the
    first level too deep, so a mebibyte of `[` costs what `limit` of them do. The bytes
    are decoded as json.loads decodes them (UTF-16 and UTF-32 too): scanned raw, a UTF-16
    character whose code unit holds a quote byte would hide the brackets after it."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError:
        return None  # json.loads cannot read it either: the route answers that
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        bracket = token[0]
        if bracket in ("[", "{"):
            depth += 1
            if depth > limit:
                return token.start()
        elif bracket in ("]", "}"):
            depth -= 1
    return None


Path = tuple[str | int, ...]  # keys and list indices from the document's root


def _entries(container: dict[str, Any] | list[Any]) -> Iterator[tuple[str | int, Any]]:
    """(key, value) of an object or (index, item) of an array."""
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _strings(document: Any) -> Iterator[tuple[Path, str]]:
    """Every string in a JSON document (keys included) with the path that leads to it, in
    document order. A stack of iterators instead of recursion: the depth is bounded before
    this runs, but a check on every body should not lean on the recursion limit."""
    if isinstance(document, str):
        yield (), document
    stack: list[tuple[Path, Iterator[tuple[str | int, Any]]]] = []
    if isinstance(document, dict | list):
        stack.append(((), _entries(document)))
    while stack:
        path, entries = stack[-1]
        for part, item in entries:
            here = (*path, part)
            if isinstance(part, str):
                yield here, part  # an object's key
            if isinstance(item, str):
                yield here, item
            elif isinstance(item, dict | list):
                stack.append((here, _entries(item)))
                break  # into it; this container's iterator resumes after it
        else:
            stack.pop()


def _first_invalid(pairs: Iterator[tuple[Path, str]]) -> ErrorDetail | None:
    for path, text in pairs:
        reason = invalid_text(text)
        if reason is not None:
            field = ".".join(map(str, path)) or None
            return ErrorDetail(code="validation_error", message=reason, field=field)
    return None


def _query_pairs(query_string: bytes) -> Iterator[tuple[Path, str]]:
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        yield (key,), key
        yield (key,), value


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return False


class RequestLimits:
    """See the module docstring. Bodies under the limit are read whole (they are small by
    then) and handed to the app unchanged; exempt prefixes stream straight through."""

    def __init__(self, app: ASGIApp, *, limits: Limits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(self.limits.exempt_prefixes):
            await self.app(scope, receive, send)
            return
        problem = _first_invalid(iter([(("path",), path)])) or _first_invalid(
            _query_pairs(scope.get("query_string", b""))
        )
        if problem is not None:
            await error_response(422, [problem])(scope, receive, send)
            return
        try:
            body = await self._read_body(scope, receive)
        except _BodyTooLarge:
            message = (
                f"the request body is over {self.limits.max_body_bytes} bytes "
                "(GANGWAY_MAX_BODY_BYTES)"
            )
            detail = ErrorDetail(code="payload_too_large", message=message)
            await error_response(413, [detail], headers={"Connection": "close"})(
                scope, receive, send
            )
            return
        if body and _is_json(scope):
            problem = self._json_problem(body)
            if problem is not None:
                await error_response(422, [problem])(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        declared = _content_length(scope)
        if declared is not None and declared > self.limits.max_body_bytes:
            raise _BodyTooLarge
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app sees an empty body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _json_problem(self, body: bytes) -> ErrorDetail | None:
        """Too deep (checked first, on the bytes), then text no database can store."""
        limit = self.limits.max_json_depth
        offset = _too_deep_at(body, limit)
        if offset is not None:
            message = (
                f"the JSON body is nested deeper than {limit} levels of arrays and objects "
                f"(GANGWAY_MAX_JSON_DEPTH), at character {offset}"
            )
            return ErrorDetail(code="validation_error", message=message)
        try:
            document = json.loads(body)
        except ValueError:
            return None  # not JSON: the route answers that itself, as before
        return _first_invalid(_strings(document))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, as one message; then the real channel (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
