"""The rank's output capture: complete lines, numbered, bounded, passed through."""

from __future__ import annotations

import io

from workers.supervisor.logtap import LineBuffer, Tap


def test_lines_are_numbered_when_complete_and_streams_do_not_mix() -> None:
    buffer = LineBuffer()
    out, err = io.StringIO(), io.StringIO()
    stdout, stderr = Tap(out, buffer, "stdout"), Tap(err, buffer, "stderr")
    stdout.write("step 1")
    stderr.write("warning\n")
    stdout.write(" loss 5.5\nstep 2\n")
    assert buffer.since(0) == [(1, "warning"), (2, "step 1 loss 5.5"), (3, "step 2")]
    assert buffer.since(2) == [(3, "step 2")]
    assert out.getvalue() == "step 1 loss 5.5\nstep 2\n"  # passed through untouched
    assert err.getvalue() == "warning\n"


def test_the_buffer_keeps_the_newest_lines() -> None:
    buffer = LineBuffer(maxlen=3)
    for number in range(10):
        buffer.write("stdout", f"line {number}\n")
    assert buffer.since(0) == [(8, "line 7"), (9, "line 8"), (10, "line 9")]
    assert buffer.since(0, limit=1) == [(8, "line 7")]
