"""The jobs the loop schedules, kept between passes and reloaded only where they changed.

A pass over 10,000 waiting jobs used to load and convert every row (ORM object, spec
parsed, core view built) to find that almost none had changed. Every write to a job row
moves its `version` (in SQL), so one narrow query (id, version) per pass says which rows to
load again; the rest keep their record and their core view. The store stays the source of
truth: a job another writer changed (a cancel, a priority change, the loop's own
transitions) has a new version and is read again; one that left the scheduled states is
dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from scheduler.model import JobSpec, JobState, JobView
from scheduler.runtime.views import job_view
from scheduler.store import JobRecord, JobRepository, ProgressNote, WaitNote
from scheduler.store.text_limits import MAX_REASON_CHARS, keep_tail


class WorkingSet:
    def __init__(self, repo: JobRepository, states: Iterable[JobState]) -> None:
        self._repo = repo
        self._states = tuple(states)
        self._records: dict[int, JobRecord] = {}
        self._views: dict[int, JobView] = {}
        self._specs: dict[int, JobSpec] = {}
        # Counts loads that found some job changed, arrived or gone: what is derived from
        # the whole set (fair-share usage) need not be derived again while it stands.
        self.generation = 0

    def load(self, only: Iterable[JobState] | None = None) -> list[JobRecord]:
        """Every job now in the states (or in `only`, some of them), in id order, as the
        store has it."""
        states = self._states if only is None else tuple(only)
        versions = self._repo.versions(states)
        stale = [
            job_id
            for job_id, version in versions.items()
            if (known := self._records.get(job_id)) is None or known.version != version
        ]
        left = [j for j, r in self._records.items() if r.state in states and j not in versions]
        if stale or left:
            self.generation += 1
        for job_id in (*left, *stale):
            self._records.pop(job_id, None)
            self._views.pop(job_id, None)
        for job_id in left:
            self._specs.pop(job_id, None)
        # A job's spec never changes: a reloaded row is not parsed again.
        for record in self._repo.many(stale, self._specs):  # a deleted row is not there
            self._records[record.id] = record
            self._specs[record.id] = record.spec
        # A job that moved out of the states between the two queries is not returned.
        return sorted((r for r in self._records.values() if r.state in states), key=lambda r: r.id)

    def noted(self, notes: Sequence[WaitNote], versions: Mapping[int, int]) -> None:
        """Patch the kept records with the wait notes this pass wrote, at the versions
        the writes gave them (`JobRepository.explain_waits`): a queue whose positions all
        shifted is not read back."""
        for note in notes:
            self._patch(
                note.job_id,
                note.seen_version,
                versions,
                status_reason=keep_tail(note.reason, MAX_REASON_CHARS),
                explanation=note.explanation,
                estimated_start_at=note.estimated_start_at,
            )

    def progressed(
        self, notes: Sequence[ProgressNote], versions: Mapping[int, int], at: datetime
    ) -> None:
        """Patch the kept records with the progress this pass stored at `at`, at the
        versions the writes gave them (`JobRepository.record_progress_many`): thousands
        of gangs reporting a step are not read back."""
        for note in notes:
            point, kept = note.point, self._records.get(note.job_id)
            first_loss = kept.first_loss if kept is not None else None  # the first one stays
            if self._patch(
                note.job_id,
                note.seen_version,
                versions,
                step=point.step,
                loss=point.loss,
                tokens_per_s=point.tokens_per_s,
                first_loss=first_loss if first_loss is not None else point.first_loss,
                progress_at=at,
            ):
                self._views.pop(note.job_id, None)  # its run info moved

    def _patch(
        self, job_id: int, seen: int | None, versions: Mapping[int, int], **fields: object
    ) -> bool:
        """Give the kept record `fields` and the version the write gave the row, if the
        write was made at the version kept. A write that did not apply that way left the
        row at another version, and the next `load` reads it again."""
        record = self._records.get(job_id)
        version = versions.get(job_id)
        if record is None or version is None or record.version != seen:
            return False
        self._records[job_id] = replace(record, version=version, **fields)  # type: ignore[arg-type]
        return True

    def view(self, record: JobRecord) -> JobView:
        """The core's view of a record `load` returned, built once per version."""
        view = self._views.get(record.id)
        if view is None:
            view = self._views[record.id] = job_view(record)
        return view
