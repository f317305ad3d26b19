"""What a path into a job's outputs may look like: one rule for the server, which refuses
any other path before it touches storage, and for the SDK, which writes downloads under
a folder of the caller's and must never write outside it.

Standard library only (the server's storage code imports it without pydantic or httpx).
A path is relative, '/'-separated, its components neither empty, '.' nor '..'; no NUL;
at most `MAX_PATH_CHARS` characters and `MAX_NAME_BYTES` bytes (UTF-8) per component,
the limits of Linux file systems, so a path that passes can be looked up without the
operating system refusing it.
"""

from __future__ import annotations

MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255


class BadPath(ValueError):
    """A path that can never name an output; the message says why."""


def path_parts(path: str) -> tuple[str, ...]:
    """`path`'s components, or `BadPath`."""
    if not path:
        raise BadPath("the path is empty")
    if len(path) > MAX_PATH_CHARS:
        raise BadPath(f"a path has at most {MAX_PATH_CHARS} characters")
    if "\x00" in path:
        raise BadPath("a path may not contain NUL")
    if path.startswith("/"):
        raise BadPath("the path must be relative to the job's outputs, not absolute")
    parts = tuple(path.split("/"))
    for part in parts:
        _check_name(part)
    return parts


def _check_name(part: str) -> None:
    if part in ("", ".", ".."):
        raise BadPath(f"a path's components may not be empty, '.' or '..' (found {part!r})")
    try:
        size = len(part.encode())
    except UnicodeEncodeError as exc:
        raise BadPath("a path must be valid UTF-8") from exc
    if size > MAX_NAME_BYTES:
        raise BadPath(f"a path's components have at most {MAX_NAME_BYTES} bytes")
