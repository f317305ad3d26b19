"""`gangway.report`, the job's own helper: what it sends is what the supervisor accepts."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from gangway import report, reporting
from workers import channel


@pytest.fixture
def supervisor_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    ours, theirs = channel.report_socket_pair()
    monkeypatch.setenv(channel.REPORT_FD_ENV, str(theirs.fileno()))
    monkeypatch.setattr(reporting, "_channel", None)
    ours.settimeout(2)
    try:
        yield ours
    finally:
        if reporting._channel is not None:
            reporting._channel.close()
        monkeypatch.setattr(reporting, "_channel", None)
        ours.close()
        theirs.close()


def test_a_report_reaches_the_supervisor_as_a_progress_point(
    supervisor_end: socket.socket,
) -> None:
    assert report(step=7, val_acc=0.5, loss=1.25, lr=3e-4, bad=float("nan")) is True
    parsed = channel.parse_report(supervisor_end.recv(channel.MAX_REPORT_BYTES))
    assert isinstance(parsed, channel.ProgressReport)
    assert (parsed.step, parsed.loss, parsed.metrics) == (7, 1.25, {"val_acc": 0.5, "lr": 3e-4})
    point = channel.metric_point(parsed, at=1.0)
    assert point == {"step": 7, "at": 1.0, "values": {"loss": 1.25, "val_acc": 0.5, "lr": 3e-4}}


def test_outside_a_rank_a_report_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(channel.REPORT_FD_ENV, raising=False)
    monkeypatch.setattr(reporting, "_channel", None)
    assert report(step=1, acc=1.0) is False


@pytest.mark.parametrize(
    ("step", "metrics", "says"),
    [
        (-1, {"a": 1.0}, "step"),
        (True, {"a": 1.0}, "step"),
        (1, {"has space": 1.0}, "has space"),
        (1, {"a": "1"}, "a number"),
        (1, {f"m{i}": 1.0 for i in range(65)}, "at most 64"),
    ],
)
def test_bad_reports_are_refused_with_the_reason(
    step: object, metrics: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        report(step, **metrics)  # type: ignore[arg-type]


def test_the_supervisor_drops_a_name_the_helper_would_refuse() -> None:
    forged = b'{"t": "progress", "step": 1, "metrics": {"a b": 1.0}}'
    assert channel.parse_report(forged) is None


def test_the_helper_imports_nothing_but_the_standard_library() -> None:
    source = reporting.__file__
    with open(source, encoding="utf-8") as handle:
        imports = [line.split()[1] for line in handle if line.startswith(("import ", "from "))]
    assert set(imports) <= {"__future__", "json", "math", "os", "re", "socket", "threading"}
