"""A gang's phase and status as the runtime sees it, and how the ranks' own statuses make
one. Ray-free, so the pure lifecycle and the store's readers import it without Ray."""

from __future__ import annotations

import enum
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from scheduler.store.records import ReportedPoint
from workers.supervisor.actor import FAILED, IDLE, RUNNING, SUCCEEDED

# How long a gang whose failed ranks all died of a broken collective waits for its
# still-running ranks before the verdict. The rank whose program raised is often not the
# first to be marked failed: its peers' collective ("a remote worker crashing") can end
# them while it is still exiting, and the job's error must name the exception, not the
# collateral. A failure whose error says nothing of a peer is final at once.
CAUSE_GRACE_S = 5.0
# How long Ray may fail to answer for a running gang (an error that lasts, a status round
# left unanswered) before the gang fails (`GANGWAY_RAY_TROUBLE_GRACE_S`).
TROUBLE_GRACE_S = 60.0
# What gloo, NCCL and torch.distributed say when a peer went away under a collective.
PEER_FAILURE = re.compile(
    r"closed by peer|reset by peer|remote worker (?:crashing|hanging)|broken pipe"
    r"|communicator was aborted|watchdog caught collective|DistNetworkError|DistBackendError",
    re.IGNORECASE,
)


class GroupPhase(enum.StrEnum):
    PLACING = "placing"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PLACEMENT_TIMEOUT = "placement_timeout"


@dataclass(frozen=True)
class GroupStatus:
    phase: GroupPhase
    ranks_started: bool = False
    step: int = 0
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    memory_mb: float | None = None  # rank 0's peak
    # Rank 0's latest step: seconds in data-parallel collectives, their payload bytes.
    comm_s: float | None = None
    comm_bytes: float | None = None
    error: str | None = None
    # One line for the job's reason: the first failing rank and what it said last.
    reason: str | None = None
    checkpoint_step: int | None = None  # the newest step the ranks have saved
    # Output lines new since the previous poll: (rank, number, line). Handed out once.
    logs: tuple[tuple[int, int, str], ...] = ()
    # Rank 0's metric points new since the previous poll. Handed out once.
    points: tuple[ReportedPoint, ...] = ()
    # Nodes whose rank actors died or went silent (a failed gang): suspect for a while.
    lost_nodes: tuple[str, ...] = ()
    # Per rank, the latest step's time in work that waits on no peer (None: not reported).
    rank_local_s: tuple[float | None, ...] = ()
    # Seconds from the stop notice until the last rank had saved and returned.
    stop_ack_s: float | None = None
    # Some rank's entrypoint was told to stop (see `RankContext.stop_seen`).
    stop_seen: bool = False
    # Rank 0's event lines this attempt (`RankContext.event`), oldest first, all of them.
    events: tuple[str, ...] = ()
    # Ranks failed of a broken collective while others run: the verdict waits (CAUSE_GRACE_S).
    cause_pending: bool = False


def aggregate(statuses: list[dict[str, Any]], *, wait_for_cause: bool = False) -> GroupStatus:
    """One status for the gang: a failed rank fails it, all succeeded succeeds it. With
    `wait_for_cause`, ranks that failed of a broken collective while others still run keep
    the gang running (`cause_pending`): the rank that really failed may be on its way out."""
    lead = statuses[0]
    progress = {key: lead[key] for key in ("step", "loss", "first_loss", "tokens_per_s")}
    progress["step_time_s"] = lead.get("step_time_s")
    progress["memory_mb"] = lead.get("memory_mb")
    progress["comm_s"] = lead.get("comm_s")
    progress["comm_bytes"] = lead.get("comm_bytes")
    saved = lead.get("checkpoint_step")  # absent from actors started by an older release
    progress["checkpoint_step"] = int(saved) if saved is not None else None
    progress["rank_local_s"] = tuple(s.get("local_s") for s in statuses)
    acks = [float(s["stop_ack_s"]) for s in statuses if s.get("stop_ack_s") is not None]
    progress["stop_ack_s"] = max(acks) if len(acks) == len(statuses) else None
    progress["stop_seen"] = any(s.get("stop_seen") for s in statuses)
    progress["events"] = tuple(str(line) for line in lead.get("events", ()))
    phases = Counter(s["phase"] for s in statuses)
    if phases[FAILED] and wait_for_cause and phases[RUNNING] and _peers_failed_them(statuses):
        return GroupStatus(GroupPhase.RUNNING, ranks_started=True, cause_pending=True, **progress)
    if phases[FAILED]:
        error, reason = _root_cause(statuses)
        return GroupStatus(
            GroupPhase.FAILED, ranks_started=True, error=error, reason=reason, **progress
        )
    if phases[IDLE]:
        rank = next(r for r, s in enumerate(statuses) if s["phase"] == IDLE)
        error = f"rank {rank} lost its state (its actor was restarted outside Gangway)"
        return GroupStatus(GroupPhase.FAILED, ranks_started=True, error=error, **progress)
    if phases[SUCCEEDED] == len(statuses):
        return GroupStatus(GroupPhase.SUCCEEDED, ranks_started=True, **progress)
    return GroupStatus(GroupPhase.RUNNING, ranks_started=True, **progress)


def _peers_failed_them(statuses: list[dict[str, Any]]) -> bool:
    """Every failed rank's error says a peer went away under a collective."""
    return all(_failed_of_a_peer(s) for s in statuses if s["phase"] == FAILED)


def _failed_of_a_peer(status: dict[str, Any]) -> bool:
    return PEER_FAILURE.search(status.get("error") or "") is not None


def _root_cause(statuses: list[dict[str, Any]]) -> tuple[str, str]:
    """The rank that failed first of its own is the cause (else the first to fail); its
    peers usually fail from the broken collective a moment later, so they are only named.
    When a rank failed is when its supervisor heard of it, which can follow a peer's by a
    moment. The whole story, and one line of it (that rank, how it ended, its last words)
    for the job's reason."""
    failed = sorted(
        (_failed_of_a_peer(s), s["failed_at"] or 0.0, rank)
        for rank, s in enumerate(statuses)
        if s["phase"] == FAILED
    )
    first = failed[0][2]
    cause = statuses[first]
    others = [str(rank) for *_, rank in sorted(failed[1:], key=lambda f: f[1:])]
    after = f" (rank(s) {', '.join(others)} failed after it)" if others else ""
    message = f"rank {first} failed{after}:\n{cause['error']}"
    summary = cause.get("summary") or f"failed: {last_line(cause['error'])}"
    return message, f"rank {first} {summary}{after}"


def last_line(text: str | None) -> str:
    """The last line of `text` that says something."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""
