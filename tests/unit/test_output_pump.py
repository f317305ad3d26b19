"""A rank's output capture: complete lines, numbered, bounded, whatever bytes come."""

from __future__ import annotations

import os
import threading

from workers.supervisor.output import MAX_LINE, LineBuffer, pump


def pumped(*chunks: bytes) -> list[tuple[int, str]]:
    read, write = os.pipe()
    buffer = LineBuffer()
    reader = threading.Thread(target=pump, args=(read, buffer))
    reader.start()
    for chunk in chunks:
        os.write(write, chunk)
    os.close(write)
    reader.join(timeout=10)
    os.close(read)
    return buffer.since(0)


def test_lines_are_numbered_when_complete_even_across_chunks() -> None:
    assert pumped(b"step 1", b" loss 5.5\nstep 2\n", b"no newline at the end") == [
        (1, "step 1 loss 5.5"),
        (2, "step 2"),
        (3, "no newline at the end"),
    ]


def test_bytes_that_are_not_text_become_replacement_characters() -> None:
    assert pumped(b"\xff\xfe bad\n", b"caf\xc3", b"\xa9\n") == [
        (1, "\ufffd\ufffd bad"),
        (2, "café"),
    ]


def test_an_endless_line_is_cut_and_the_rest_of_it_dropped() -> None:
    lines = pumped(b"x" * (3 * MAX_LINE), b"y" * (3 * MAX_LINE), b"\nnext\n")
    assert [len(line) for _, line in lines] == [MAX_LINE, 4]
    assert lines[1] == (2, "next")


def test_the_buffer_keeps_the_newest_lines() -> None:
    buffer = LineBuffer(maxlen=3)
    for number in range(10):
        buffer.append(f"line {number}")
    assert buffer.since(0) == [(8, "line 7"), (9, "line 8"), (10, "line 9")]
    assert buffer.since(0, limit=1) == [(8, "line 7")]
    assert buffer.tail(2) == ["line 8", "line 9"]
