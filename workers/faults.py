"""Fault injection for tests: named points in the service and the ranks that can stall,
crash or kill their process when `GANGWAY_FAULTS` asks.

`GANGWAY_FAULTS="point:action[@N][,point:action...]"`, actions:
  - `sleep=S`: stall S seconds (a pass stalled past the lease TTL, a paused heartbeat);
  - `kill`: SIGKILL this process (a rank that dies in the middle of a checkpoint save);
  - `raise`: raise `InjectedFault`;
  - `nan`: make a value NaN where the code asks `poison(point)` (the training engine's
    loss at `engine.loss`, for its numerical-health checks); `inject` ignores it.
`@N` fires only on the N-th time the point is reached (1-based), else every time.

The service passes the variable on to every rank it starts, so one setting reaches both
sides. Unset (production), `inject` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

ENV = "GANGWAY_FAULTS"


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    action: str
    arg: float = 0.0
    nth: int | None = None


def parse(text: str) -> dict[str, Fault]:
    """`point:action[=arg][@N]`, comma-separated; a malformed entry is a ValueError."""
    faults: dict[str, Fault] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        point, sep, rest = entry.partition(":")
        if not sep:
            raise ValueError(f"{ENV}: {entry!r} is not point:action")
        rest, _, nth = rest.partition("@")
        action, _, arg = rest.partition("=")
        if action not in ("sleep", "kill", "raise", "nan"):
            raise ValueError(f"{ENV}: unknown action {action!r} in {entry!r}")
        faults[point] = Fault(action, float(arg or 0), int(nth) if nth else None)
    return faults


_faults = parse(os.environ.get(ENV, ""))
_seen: Counter[str] = Counter()
_lock = threading.Lock()


def configure(text: str) -> None:
    """Replace the configured faults (and their counts) with `text`: for a test that gives
    each of its processes its own faults after they imported this module."""
    faults = parse(text)
    with _lock:
        _faults.clear()
        _faults.update(faults)
        _seen.clear()


def inject(point: str) -> None:
    """Act on the fault configured for `point`, if any."""
    fault = _faults.get(point)
    if fault is None or fault.action == "nan" or not _fires(point, fault):
        return
    if fault.action == "sleep":
        time.sleep(fault.arg)
    elif fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise InjectedFault(f"fault injected at {point}")


def poison(point: str) -> bool:
    """Whether to make the value at `point` NaN (a `nan` fault that fires this time)."""
    fault = _faults.get(point)
    return fault is not None and fault.action == "nan" and _fires(point, fault)


def _fires(point: str, fault: Fault) -> bool:
    """Count this pass of `point`; whether its fault acts on it (`@N`)."""
    with _lock:
        _seen[point] += 1
        count = _seen[point]
    return fault.nth is None or count == fault.nth


def passthrough() -> dict[str, str]:
    """The variable for a rank's environment (empty when no fault is configured)."""
    value = os.environ.get(ENV)
    return {ENV: value} if value else {}
