"""Pages of JSON under a byte budget.

Each item is serialized once, straight to the bytes sent (no second validation pass of
the whole page through the response model), and the page stops at the item that would
take it past the budget: `next_cursor` then points there, so a client pages on as usual.
One item is always sent, so a page always makes progress.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from fastapi import Response
from pydantic import BaseModel

from gangway.models import JobInfo

M = TypeVar("M", bound=BaseModel)


def fitting(items: Iterable[M], max_bytes: int) -> tuple[list[tuple[M, bytes]], bool]:
    """The leading items with their JSON, as many as `max_bytes` holds (at least one),
    and whether any were left out for the budget."""
    kept: list[tuple[M, bytes]] = []
    size = 0
    for item in items:
        encoded = item.model_dump_json().encode()
        if kept and size + len(encoded) > max_bytes:
            return kept, True
        kept.append((item, encoded))
        size += len(encoded) + 1
    return kept, False


def page_response(items: Iterable[JobInfo], *, more: bool, max_bytes: int) -> Response:
    kept, cut = fitting(items, max_bytes)
    more = more or cut
    cursor = kept[-1][0].id if more and kept else None
    parts = b",".join(encoded for _, encoded in kept)
    body = b'{"items":[' + parts + b'],"next_cursor":' + _json_int(cursor) + b"}"
    return Response(content=body, media_type="application/json")


def _json_int(value: int | None) -> bytes:
    return b"null" if value is None else str(value).encode()
