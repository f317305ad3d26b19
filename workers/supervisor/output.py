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

MAX_LINE = 4000  # characters kept of one line
_CHUNK = 65536


class LineBuffer:
    """The newest `maxlen` lines, numbered from 1, safe across threads."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=maxlen)
        self._next = 1
        self._lock = threading.Lock()

    def append(self, line: str) -> None:
        with self._lock:
            self._lines.append((self._next, line[:MAX_LINE]))
            self._next += 1

    def since(self, after: int, limit: int = 1000) -> list[tuple[int, str]]:
        """Up to `limit` lines numbered above `after`, oldest first."""
        with self._lock:
            if not self._lines:
                return []
            start = max(0, after + 1 - self._lines[0][0])  # numbers are consecutive
            return list(itertools.islice(self._lines, start, start + limit))

    def tail(self, count: int) -> list[str]:
        """The newest `count` lines."""
        with self._lock:
            return [line for _, line in list(self._lines)[-count:]]


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
