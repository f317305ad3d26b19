"""Report metrics from a job's own code, whatever runs it:

    from gangway import report
    report(step=100, val_acc=0.91, loss=0.42)

Inside a Gangway rank the point goes to the rank's supervisor over the report channel the
rank inherited (a socket whose number is in `RANK_REPORT_FD`; see `workers.channel`), and
the service stores it by step and attempt: `gangway metrics JOB --name val_acc`. Rank 0's
reports are the job's. Outside Gangway (a laptop run of the same script) `report` does
nothing and returns False, so a script needs no switch.

Only the standard library is imported: a command or script job may run in a virtualenv
that holds its own packages and this one file of Gangway's.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading

# The variable and size limit of `workers.channel` (a test keeps them equal).
REPORT_FD_ENV = "RANK_REPORT_FD"
MAX_REPORT_BYTES = 64 * 1024
MAX_METRICS = 64
METRIC_NAME = r"^[A-Za-z0-9_.:/-]{1,100}$"
_NAME = re.compile(METRIC_NAME)

_lock = threading.Lock()
_channel: socket.socket | None = None


def report(step: int, **metrics: float) -> bool:
    """Report `metrics` (names of letters, digits and `_.:/-`; numbers) at `step`.
    `loss` and `tokens_per_s` also become the job's progress. Values that are not
    finite are left out. Returns whether the point was handed to the supervisor."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, not {step!r}")
    if len(metrics) > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics per report, not {len(metrics)}")
    for name, value in metrics.items():
        if not _NAME.match(name):
            raise ValueError(f"metric name {name!r}: letters, digits and _.:/- (1-100)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"metric {name}: a number, not {type(value).__name__}")
    channel = _open_channel()
    if channel is None:
        return False
    data = json.dumps(_point(step, metrics)).encode()
    try:
        channel.send(data[:MAX_REPORT_BYTES])
    except OSError:
        return False
    return True


def _point(step: int, metrics: dict[str, float]) -> dict[str, object]:
    finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
    point: dict[str, object] = {"t": "progress", "step": step}
    for field in ("loss", "tokens_per_s"):
        if field in finite:
            point[field] = finite.pop(field)
    point["metrics"] = finite
    return point


def _open_channel() -> socket.socket | None:
    """The rank's report socket, opened once; None outside a Gangway rank."""
    global _channel  # noqa: PLW0603 (one socket per process, opened on first use)
    with _lock:
        if _channel is None:
            fd = os.environ.get(REPORT_FD_ENV, "")
            if not fd.isdigit():
                return None
            try:
                # A duplicate: closing ours never closes the rank's own channel.
                _channel = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                return None
            _channel.settimeout(2.0)
        return _channel
