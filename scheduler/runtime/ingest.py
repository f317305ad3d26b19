"""Ingest what a gang reports: progress, reported metric points, log lines and straggler
flags."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.runtime.gangs.status import GroupStatus
from scheduler.runtime.stragglers import StragglerWatch
from scheduler.store import JobRecord, JobRepository, ProgressNote, ProgressPoint


class ProgressIngest:
    def __init__(self, repo: JobRepository, stragglers: StragglerWatch) -> None:
        self._repo = repo
        self._stragglers = stragglers
        # (job, attempt) -> how many of rank 0's event lines are recorded
        self._events_seen: dict[tuple[int, int], int] = {}

    def keep_only(self, job_ids: set[int]) -> None:
        """Forget straggler history and event counts of gangs that are gone."""
        self._stragglers.keep_only(job_ids)
        self._events_seen = {k: v for k, v in self._events_seen.items() if k[0] in job_ids}

    def record(
        self, job: JobRecord, status: GroupStatus, node_names: Mapping[str, str]
    ) -> ProgressNote | None:
        """Store new log lines and straggler flags; the progress point to store when the
        step moved (the loop stores a pass's points in one transaction)."""
        self._repo.append_logs(job.id, job.attempt, status.logs)
        self._repo.append_points(job.id, job.attempt, status.points, job.spec.objective)
        self._record_events(job, status.events)
        if status.step == job.step:
            return None
        point = ProgressPoint(
            step=status.step,
            loss=status.loss,
            first_loss=status.first_loss,
            tokens_per_s=status.tokens_per_s,
            step_time_s=status.step_time_s,
            memory_mb=status.memory_mb,
            comm_s=status.comm_s,
            comm_bytes=status.comm_bytes,
            checkpoint_step=status.checkpoint_step,
        )
        self._watch_stragglers(job, status, node_names)
        return ProgressNote(job.id, job.attempt, point, job.version)

    def _record_events(self, job: JobRecord, lines: tuple[str, ...]) -> None:
        """Rank 0's event lines (`RankContext.event`: how the trainer split its stages, a
        change of batch shares) become events that keep the job's state, each once. The
        count recorded is kept per attempt; a service that restarts finds it again from
        the job's events (a line is new unless an event already says exactly it)."""
        key = (job.id, job.attempt)
        seen = self._events_seen.get(key)
        if seen == len(lines) or not lines:
            return
        fresh = [f"attempt {job.attempt}: {line}" for line in lines[seen or 0 :]]
        if seen is None:
            recorded = {event.reason for event in self._repo.events(job.id)}
            fresh = [reason for reason in fresh if reason not in recorded]
        for reason in fresh:
            self._repo.annotate(job.id, reason)
        self._events_seen[key] = len(lines)

    def _watch_stragglers(
        self, job: JobRecord, status: GroupStatus, node_names: Mapping[str, str]
    ) -> None:
        """Flag ranks persistently slower than their peers (and unflag them), once per
        change: the job's `stragglers` and an event that keeps its state."""
        found = self._stragglers.observe(job.id, job.attempt, status.rank_local_s)
        if found is None or job.placement is None:
            return
        if [s.rank for s in found] == [s["rank"] for s in job.stragglers]:
            return
        nodes = [job.placement[s.rank] for s in found]
        flagged = [
            {
                "rank": s.rank,
                "node_id": node,
                "local_s": round(s.local_s, 4),
                "ratio": round(s.ratio, 2),
            }
            for s, node in zip(found, nodes, strict=True)
        ]
        described = "; ".join(
            f"rank {s.rank} on {node_names.get(node, node)} needs {s.local_s:.3f} s "
            f"of local work per step, {s.ratio:.1f}x the gang's median"
            for s, node in zip(found, nodes, strict=True)
        )
        reason = (
            f"straggler: {described} (median over the last {self._stragglers.window} polls)"
            if found
            else f"no straggler: every rank within {self._stragglers.factor:g}x of the median"
        )
        self._repo.annotate(job.id, reason, stragglers=flagged)
