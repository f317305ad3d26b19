"""When a job's prediction is written again: the rules `Predictions.record` applies to
what each pass predicts (a waiting job's end follows its estimated start; a prediction is
rewritten only when it moved enough to matter)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from scheduler.store.predictions import JobPrediction


def ending(p: JobPrediction, start: datetime | None) -> JobPrediction:
    """A waiting job ends its predicted run time after its estimated start."""
    if p.estimated_end_at is None and start is not None and p.runtime_s is not None:
        return replace(p, estimated_end_at=start + timedelta(seconds=p.runtime_s))
    return p


def moved(old: JobPrediction | None, new: JobPrediction) -> bool:
    """Worth a write: a new source, or a total or end that moved by more than 2% (30 s
    at least). Measured step times wobble every poll; rewriting each would be noise."""
    if old is None or old.source != new.source:
        return True
    slack = max(30.0, 0.02 * (new.runtime_s or 0.0))
    old_end, new_end = _seconds(old.estimated_end_at), _seconds(new.estimated_end_at)
    return _apart(old.runtime_s, new.runtime_s, slack) or _apart(old_end, new_end, slack)


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def _apart(a: float | None, b: float | None, slack: float) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return abs(a - b) > slack
