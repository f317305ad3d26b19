"""Capture what a rank prints, line by line, without losing it for Ray's own logs.

The rank actor swaps `sys.stdout` and `sys.stderr` for taps that pass every write on to
the original stream (Ray's worker log files) and keep complete lines, numbered, in a
bounded buffer. The runtime asks for the lines after the last number it stored, with each
status poll, so the store holds a rank's output even after its node is gone.
Output written below Python (C++ warnings from gloo) reaches Ray's files only.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import TextIO

MAX_LINE = 4000  # characters kept of one line


class LineBuffer:
    """The newest `maxlen` complete lines, numbered from 1, safe across threads."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=maxlen)
        self._next = 1
        self._partial: dict[str, str] = {}
        self._lock = threading.Lock()

    def write(self, stream: str, text: str) -> None:
        with self._lock:
            pending = self._partial.get(stream, "") + text
            *complete, rest = pending.split("\n")
            for line in complete:
                self._lines.append((self._next, line[:MAX_LINE]))
                self._next += 1
            self._partial[stream] = rest[: MAX_LINE * 4]

    def since(self, after: int, limit: int = 1000) -> list[tuple[int, str]]:
        """Up to `limit` lines numbered above `after`, oldest first."""
        with self._lock:
            if not self._lines:
                return []
            start = max(0, after + 1 - self._lines[0][0])  # numbers are consecutive
            return list(itertools.islice(self._lines, start, start + limit))


class Tap:
    """A text stream that writes through to `original` and into `buffer`."""

    def __init__(self, original: TextIO, buffer: LineBuffer, name: str) -> None:
        self._original, self._buffer, self._name = original, buffer, name

    def write(self, text: str) -> int:
        self._buffer.write(self._name, text)
        return self._original.write(text)

    def flush(self) -> None:
        self._original.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._original.fileno()
