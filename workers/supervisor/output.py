"""What a rank program prints, kept line by line for the service, whatever the bytes.

The program's stdout and stderr are one pipe; a thread of the supervisor reads it in
chunks and keeps complete lines, numbered, in a bounded buffer. The runtime asks for the
lines after the last number it stored with each status poll, so the store holds a rank's
output even after its node is gone.

The bytes are the job's: they may be any length, any encoding, or no text at all. A line
is cut at `MAX_LINE` characters (the rest of it dropped, never buffered whole), and bytes
that are not UTF-8 become U+FFFD. The pump never stops reading before the pipe closes, so
the program never blocks on a full pipe.
"""

from __future__ import annotations

import codecs
import collections
import itertools
import os
import threading
from typing import Generic, TypeVar

MAX_LINE = 4000  # characters kept of one line
_CHUNK = 65536
T = TypeVar("T")


class Numbered(Generic[T]):
    """The newest `maxlen` items, numbered from 1, safe across threads: a reader asks
    for those above the last number it has, so each is handed out once per reader."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._items: collections.deque[tuple[int, T]] = collections.deque(maxlen=maxlen)
        self._next = 1
        self._lock = threading.Lock()

    def append(self, item: T) -> None:
        with self._lock:
            self._items.append((self._next, item))
            self._next += 1

    def since(self, after: int, limit: int = 1000) -> list[tuple[int, T]]:
        """Up to `limit` items numbered above `after`, oldest first."""
        with self._lock:
            if not self._items:
                return []
            start = max(0, after + 1 - self._items[0][0])  # numbers are consecutive
            return list(itertools.islice(self._items, start, start + limit))

    def tail(self, count: int) -> list[T]:
        """The newest `count` items."""
        with self._lock:
            return [item for _, item in list(self._items)[-count:]]


class LineBuffer(Numbered[str]):
    """Output lines, each cut at `MAX_LINE` characters."""

    def append(self, item: str) -> None:
        super().append(item[:MAX_LINE])


def pump(fd: int, buffer: LineBuffer) -> None:
    """Read `fd` to its end into `buffer`, line by line (see the module docstring)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    dropping = False  # inside a line already cut at MAX_LINE
    while chunk := os.read(fd, _CHUNK):
        *complete, rest = (partial + decoder.decode(chunk)).split("\n")
        for line in complete:
            if not dropping:
                buffer.append(line)
            dropping = False
        if len(rest) > MAX_LINE:
            if not dropping:
                buffer.append(rest)
            dropping, rest = True, ""
        partial = rest
    partial += decoder.decode(b"", final=True)
    if partial and not dropping:
        buffer.append(partial)
