"""A page of jobs as JSON under a byte budget.

Each item is serialized once, straight to the bytes sent (no second validation pass of
the whole page through the response model), and the page stops at the item that would
take it past the budget: `next_cursor` then points there, so a client pages on as usual.
One item is always sent, so a page always makes progress.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import Response

from gangway.models import JobInfo


def page_response(items: Iterable[JobInfo], *, more: bool, max_bytes: int) -> Response:
    parts: list[bytes] = []
    size, last_id = 0, None
    for item in items:
        encoded = item.model_dump_json().encode()
        if parts and size + len(encoded) > max_bytes:
            more = True
            break
        parts.append(encoded)
        size += len(encoded) + 1
        last_id = item.id
    cursor = last_id if more and last_id is not None else None
    body = b'{"items":[' + b",".join(parts) + b'],"next_cursor":' + _json_int(cursor) + b"}"
    return Response(content=body, media_type="application/json")


def _json_int(value: int | None) -> bytes:
    return b"null" if value is None else str(value).encode()
