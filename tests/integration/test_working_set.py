"""The loop's working set (issue 15): every write to a job moves its version, and the set
reloads exactly the jobs whose version moved, so a pass over a big queue reads only what
changed and still never acts on a stale job."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import pytest

from scheduler.model import JobSpec, JobState
from scheduler.runtime.working_set import WorkingSet
from scheduler.store import JobRecord, JobRepository, NewJob, ProgressPoint, WaitNote

SCHEDULED = (JobState.PENDING, JobState.ADMITTED, JobState.RUNNING)


def new_job(name: str = "j") -> NewJob:
    spec = {"parallelism": {"dp": 1, "tp": 1, "pp": 1}, "entrypoint": {"kind": "builtin"}}
    return NewJob(name=name, queue="default", priority=0, spec=spec, num_gpus=1, total_steps=10)


def count_loads(repo: JobRepository, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of every job `repo.many` loads from now on."""
    loaded: list[int] = []
    many = repo.many

    def counted(
        job_ids: Iterable[int], specs: Mapping[int, JobSpec] | None = None
    ) -> list[JobRecord]:
        records = many(job_ids, specs)
        loaded.extend(r.id for r in records)
        return records

    monkeypatch.setattr(repo, "many", counted)
    return loaded


def test_every_kind_of_write_moves_the_version(repo: JobRepository) -> None:
    job = repo.create(new_job())
    versions = [job.version]
    repo.explain_wait(job.id, "needs 8 GPUs")
    versions.append(repo.get(job.id).version)
    repo.annotate(job.id, "priority changed", priority=5)
    versions.append(repo.get(job.id).version)
    repo.transition(job.id, JobState.ADMITTED, reason="admitted", placement=["n"])
    versions.append(repo.get(job.id).version)
    repo.record_progress(job.id, 1, ProgressPoint(3, loss=1.0))
    versions.append(repo.get(job.id).version)
    assert versions == sorted(set(versions)) and len(versions) == 5


def test_the_set_reloads_only_what_changed_and_drops_what_left(
    repo: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [repo.create(new_job(f"j{i}")).id for i in range(5)]
    loaded = count_loads(repo, monkeypatch)
    working = WorkingSet(repo, SCHEDULED)
    assert [r.id for r in working.load()] == ids
    assert sorted(loaded) == ids
    loaded.clear()

    assert [r.id for r in working.load()] == ids  # nothing changed: nothing read
    assert loaded == []

    repo.annotate(ids[1], "priority changed", priority=9)
    repo.transition(ids[2], JobState.CANCELLED, reason="cancelled by user")
    newcomer = repo.create(new_job("late")).id
    records = {r.id: r for r in working.load()}
    assert sorted(loaded) == [ids[1], newcomer]  # the cancelled one left the states
    assert sorted(records) == [ids[0], ids[1], ids[3], ids[4], newcomer]
    assert records[ids[1]].priority == 9
    assert working.view(records[ids[1]]).priority == 9  # the core's view follows the row


def test_notes_are_written_in_one_batch_and_only_to_pending_jobs(repo: JobRepository) -> None:
    waiting, admitted = repo.create(new_job("w")), repo.create(new_job("a"))
    repo.transition(admitted.id, JobState.ADMITTED, reason="admitted", placement=["n"])
    at = datetime(2030, 1, 1, tzinfo=UTC)
    repo.explain_waits(
        [
            WaitNote(waiting.id, "needs 8 GPUs", {"message": "m", "queue_position": 1}, at),
            WaitNote(admitted.id, "stale note", None, None),
        ]
    )
    got = repo.get(waiting.id)
    assert (got.status_reason, got.explanation, got.estimated_start_at) == (
        "needs 8 GPUs",
        {"message": "m", "queue_position": 1},
        at,
    )
    assert got.version > waiting.version
    assert repo.get(admitted.id).status_reason != "stale note"


def test_a_note_written_at_the_version_seen_is_patched_in_without_a_reload(
    repo: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = repo.create(new_job("a")), repo.create(new_job("b"))
    working = WorkingSet(repo, SCHEDULED)
    kept = {r.id: r for r in working.load()}
    repo.annotate(second.id, "priority changed", priority=3)  # moves on after the load
    notes = [
        WaitNote(job.id, "needs 8 GPUs", {"queue_position": n}, None, kept[job.id].version)
        for n, job in enumerate((first, second), start=1)
    ]
    versions = repo.explain_waits(notes)
    working.noted(notes, versions)

    assert repo.get(first.id).version == versions[first.id]  # applied: the version it gave
    assert repo.get(second.id).status_reason != "needs 8 GPUs"  # the row had moved on
    loaded = count_loads(repo, monkeypatch)
    records = {r.id: r for r in working.load()}
    assert loaded == [second.id]  # only the row that moved is read again
    assert records[first.id].explanation == {"queue_position": 1}
    assert records[first.id].status_reason == "needs 8 GPUs"
    assert records[second.id].priority == 3


def test_a_row_the_loop_moved_itself_is_kept_as_written_and_not_read_again(
    repo: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, ending = repo.create(new_job("r")), repo.create(new_job("e"))
    working = WorkingSet(repo, SCHEDULED)
    before = working.load()
    generation = working.generation
    working.written(
        repo.transition(running.id, JobState.ADMITTED, reason="admitted", placement=["n"])
    )
    working.written(repo.transition(ending.id, JobState.CANCELLED, reason="cancelled"))
    assert working.generation > generation  # the set changed: what derives from it too
    assert working.records[running.id].state is JobState.ADMITTED  # seen before any load
    assert ending.id not in working.records  # left the states

    loaded = count_loads(repo, monkeypatch)
    after = working.load()
    assert loaded == []  # the store holds what the loop wrote: nothing to read
    assert [r.id for r in after] == [running.id] and after is not before
    assert working.load() is after  # nothing moved since: the same list, not sorted again
