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
        self._versions: dict[int, int] = {}  # each kept record's version, to compare
        self._in_order: list[JobRecord] | None = None  # the records by id, until one moves
        self._views: dict[int, JobView] = {}
        self._specs: dict[int, JobSpec] = {}
        # Counts loads and writes that found or made some job changed, arrived or gone:
        # what is derived from the whole set (fair-share usage) need not be derived again
        # while it stands.
        self.generation = 0
        # Counts every change to a kept record, the loop's own patches included: what is
        # derived from every record (predictions) stands while it does.
        self.revision = 0

    def load(self) -> list[JobRecord]:
        """Every job now in the states, in id order, as the store has it."""
        versions = self._repo.versions(self._states)
        if versions != self._versions:  # else nothing moved: one comparison, in C
            self._reload(versions)
        if self._in_order is None:
            self._in_order = sorted(self._records.values(), key=lambda r: r.id)
        return self._in_order

    def _reload(self, versions: dict[int, int]) -> None:
        known = self._versions
        stale = [job_id for job_id, version in versions.items() if known.get(job_id) != version]
        left = [job_id for job_id in known if job_id not in versions]
        self.generation += 1
        for job_id in left:
            self._drop(job_id)
        # A job's spec never changes: a reloaded row is not parsed again.
        for record in self._repo.many(stale, self._specs):  # a deleted row is not there
            self._keep(record)  # dropped if it moved on since the first query

    @property
    def records(self) -> Mapping[int, JobRecord]:
        """The kept jobs by id, as the last `load` and this loop's own writes since
        (`written`, `noted`, `progressed`) left them, without asking the store: a row
        another writer moved meanwhile is seen at the next `load`, and every write the
        loop makes with it is conditional on the state or version it holds."""
        return self._records

    def written(self, record: JobRecord) -> None:
        """Keep a row as one of this loop's writes returned it (a transition), so the
        next `load` need not read it again; one that left the states is dropped."""
        self.generation += 1
        self._keep(record)

    def _keep(self, record: JobRecord, *, view_moved: bool = True) -> None:
        """Hold `record` as the job's row now, or drop the job if it left the states.
        `view_moved`: the row changed what the core sees of it (its view is rebuilt)."""
        if record.state not in self._states:
            self._drop(record.id)
            return
        self.revision += 1
        self._in_order = None
        self._records[record.id] = record
        self._versions[record.id] = record.version
        self._specs[record.id] = record.spec
        if view_moved:
            self._views.pop(record.id, None)

    def _drop(self, job_id: int) -> None:
        self.revision += 1
        self._in_order = None
        for kept in (self._records, self._versions, self._views, self._specs):
            kept.pop(job_id, None)

    def noted(self, notes: Sequence[WaitNote], versions: Mapping[int, int]) -> None:
        """Patch the kept records with the wait notes this pass wrote, at the versions
        the writes gave them (`JobRepository.explain_waits`): a queue whose positions all
        shifted is not read back."""
        for note in notes:
            self._patch(
                note.job_id,
                note.seen_version,
                versions,
                False,  # a wait note changes nothing the core sees
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
            self._patch(
                note.job_id,
                note.seen_version,
                versions,
                True,  # progress moves the job's run info
                step=point.step,
                loss=point.loss,
                tokens_per_s=point.tokens_per_s,
                first_loss=first_loss if first_loss is not None else point.first_loss,
                progress_at=at,
                checkpoint_step=point.checkpoint_step,
                step_time_s=point.step_time_s,
            )

    def _patch(
        self,
        job_id: int,
        seen: int | None,
        versions: Mapping[int, int],
        view_moved: bool,
        **fields: object,
    ) -> None:
        """Give the kept record `fields` and the version the write gave the row, if the
        write was made at the version kept. A write that did not apply that way left the
        row at another version, and the next `load` reads it again."""
        record = self._records.get(job_id)
        version = versions.get(job_id)
        if record is None or version is None or record.version != seen:
            return
        self._keep(replace(record, version=version, **fields), view_moved=view_moved)  # type: ignore[arg-type]

    def view(self, record: JobRecord) -> JobView:
        """The core's view of a record `load` returned, built once per version."""
        view = self._views.get(record.id)
        if view is None:
            view = self._views[record.id] = job_view(record)
        return view
