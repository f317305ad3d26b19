"""The two channels between a rank supervisor and its rank program, and what crosses them.

Reports (program -> supervisor) are datagrams on a Unix socket pair whose program end the
program inherits (its number in `RANK_REPORT_FD`): one JSON object per datagram, so
no framing can be forged by output and several processes of the rank may write to it.
Nothing else reaches that socket: it has no name on any filesystem or network. Control
messages (supervisor -> program) are JSON lines on the program's stdin: the start signal
with the rendezvous address, a stop notice, a request for the stacks.

The program is untrusted, so the supervisor parses every report with `parse_report`:
bounded size, known kinds, typed fields; anything else is dropped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gangway.reporting import MAX_METRICS, METRIC_NAME
from gangway.reporting import MAX_REPORT_BYTES as MAX_REPORT_BYTES
from gangway.reporting import REPORT_FD_ENV as REPORT_FD_ENV

# The variable (not GANGWAY_*: that prefix is the service's, and a rank holds none of its
# variables), the bounds and the names are those of `gangway.report`, the job's own helper.
MAX_TEXT = 60_000


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProgressReport(_Message):
    t: Literal["progress"] = "progress"
    step: int = Field(ge=0)
    loss: float | None = None
    tokens_per_s: float | None = None
    metrics: dict[Annotated[str, Field(pattern=METRIC_NAME)], float] = Field(
        default_factory=dict, max_length=MAX_METRICS
    )


class EventReport(_Message):
    """A line for the job's event timeline (`RankContext.event`)."""

    t: Literal["event"] = "event"
    text: str = Field(max_length=MAX_TEXT)


class StopSeenReport(_Message):
    """The entrypoint was told to stop (it asked `should_stop` and got True)."""

    t: Literal["stop_seen"] = "stop_seen"


class StacksReport(_Message):
    t: Literal["stacks"] = "stacks"
    text: str = Field(max_length=MAX_TEXT)


class ErrorReport(_Message):
    """Why the entrypoint failed: its traceback, as the job's own words."""

    t: Literal["error"] = "error"
    text: str = Field(max_length=MAX_TEXT)


class ReadyReport(_Message):
    """The program has loaded what it runs and waits for the start signal."""

    t: Literal["ready"] = "ready"


Report = Annotated[
    ProgressReport | EventReport | StopSeenReport | StacksReport | ErrorReport | ReadyReport,
    Field(discriminator="t"),
]


_REPORTS: TypeAdapter[Report] = TypeAdapter(Report)


def metric_point(report: ProgressReport, at: float) -> dict[str, Any]:
    """A progress report as one point of the job's metric series: its step, when it came,
    and every finite value it carries by name (`loss` and `tokens_per_s` among them)."""
    values = {"loss": report.loss, "tokens_per_s": report.tokens_per_s, **report.metrics}
    finite = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    return {"step": report.step, "at": at, "values": finite}


def parse_report(data: bytes) -> Report | None:
    """A report from the program, or None for anything malformed or too large."""
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        return _REPORTS.validate_json(data)
    except (ValidationError, ValueError):
        return None


def encode(report: Report) -> bytes:
    return _REPORTS.dump_json(report)


def report_socket_pair() -> tuple[socket.socket, socket.socket]:
    """(supervisor end, program end). The program end is inheritable: it is passed to the
    program, which finds its number in `REPORT_FD_ENV`."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    theirs.set_inheritable(True)
    return ours, theirs


class ReportSender:
    """The program's end: sends one report per datagram. A full buffer blocks for at most
    `timeout_s`, then the report is dropped (a later progress report supersedes it);
    training never waits long on its supervisor."""

    def __init__(self, fd: int, timeout_s: float = 2.0) -> None:
        self._socket = socket.socket(fileno=fd)
        self._socket.settimeout(timeout_s)

    @classmethod
    def from_environment(cls) -> ReportSender | None:
        fd = os.environ.get(REPORT_FD_ENV)
        return cls(int(fd)) if fd and fd.isdigit() else None

    def send(self, report: Report) -> None:
        data = encode(report)[:MAX_REPORT_BYTES]
        # The supervisor is gone or busy: the rank's own work goes on.
        with contextlib.suppress(OSError):
            self._socket.send(data)


# Control messages on the program's stdin, one JSON object per line.
def go_message(master_addr: str, master_port: int) -> bytes:
    return json.dumps({"go": {"master_addr": master_addr, "master_port": master_port}}).encode()


STOP_MESSAGE = b'{"stop": true}'
STACKS_MESSAGE = b'{"stacks": true}'
