"""Bounds on the free text the service itself stores about a job.

A job's `error` is the tail of what its ranks printed, and reasons quote exceptions and
user-chosen names: either can be arbitrarily long. The tail is kept (a traceback's last
lines say what failed), marked as cut so nobody mistakes it for the whole text.
"""

from __future__ import annotations

from typing import Any

MAX_ERROR_CHARS = 16 * 1024
MAX_REASON_CHARS = 2 * 1024
CUT_MARK = "[...] "


def keep_tail(text: str, max_chars: int) -> str:
    """`text` itself when it fits, else its last characters after a cut mark, `max_chars`
    in all."""
    if len(text) <= max_chars:
        return text
    return CUT_MARK + text[len(text) - (max_chars - len(CUT_MARK)) :]


def bounded_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (columns about to be written) with `error` and `status_reason` bounded."""
    bounded = dict(fields)
    if isinstance(bounded.get("error"), str):
        bounded["error"] = keep_tail(bounded["error"], MAX_ERROR_CHARS)
    if isinstance(bounded.get("status_reason"), str):
        bounded["status_reason"] = keep_tail(bounded["status_reason"], MAX_REASON_CHARS)
    return bounded
