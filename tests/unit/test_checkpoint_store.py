"""Checkpoints in a store named by a URL: what counts as complete, what a supervisor
uploads from a rank's own directory (never a link the program planted), restore, prune
and delete. On fsspec's in-memory filesystem; tests/integration/test_checkpoint_s3.py
runs the same store against an S3 server."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from workers.checkpoint_store import CheckpointStore, JobCheckpointStore, RankOf
from workers.supervisor.checkpoint_sync import CheckpointSync


@pytest.fixture
def store() -> CheckpointStore:
    return CheckpointStore(f"memory://gangway-{uuid.uuid4().hex[:8]}/checkpoints")


def save(directory: Path, step: int, rank: int, *, metadata: bool) -> Path:
    """What a rank leaves in its own directory after a save at `step`."""
    step_dir = directory / f"step-{step:08d}"
    step_dir.mkdir(parents=True)
    (step_dir / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 100)
    if metadata:
        (step_dir / ".metadata").write_bytes(b"meta")
    return step_dir


def sync_for(job: JobCheckpointStore, tmp: Path, rank: int, world: int, attempt: int = 1):
    lines: list[str] = []
    sync = CheckpointSync(
        job, tmp / f"a{attempt}-r{rank}", RankOf(attempt, rank, world), 2, lines.append
    )
    return sync, lines


def test_a_checkpoint_counts_once_every_rank_of_its_world_uploaded(
    store: CheckpointStore, tmp_path: Path
) -> None:
    job = store.job(7)
    rank0, _ = sync_for(job, tmp_path, 0, 2)
    rank1, _ = sync_for(job, tmp_path, 1, 2)
    save(tmp_path / "a1-r0", 10, 0, metadata=True)
    rank0.upload_finished(final=True)
    assert job.listing() == []  # rank 1's shard is not there yet
    save(tmp_path / "a1-r1", 10, 1, metadata=False)
    rank1.upload_finished(final=True)
    [done] = job.listing()
    assert (done.step, done.bytes) == (10, 204)
    assert done.files == (".metadata", "__0_0.distcp", "__1_0.distcp")
    assert done.url == f"{store.url}/job-7/attempt-1/step-00000010"
    assert not (tmp_path / "a1-r0" / "step-00000010").exists()  # uploaded: off the host


def test_a_restarted_attempt_restores_the_newest_complete_one_whole(
    store: CheckpointStore, tmp_path: Path
) -> None:
    job = store.job(3)
    for step in (10, 20):
        for rank in (0, 1):
            sync, _ = sync_for(job, tmp_path, rank, 2)
            save(tmp_path / f"a1-r{rank}", step, rank, metadata=rank == 0)
            sync.upload_finished(final=True)
    # step 30: rank 1's host was cut off before its upload
    sync, _ = sync_for(job, tmp_path, 0, 2)
    save(tmp_path / "a1-r0", 30, 0, metadata=True)
    sync.upload_finished(final=True)
    assert [c.step for c in job.listing()] == [10, 20]

    restored, lines = sync_for(job, tmp_path, 1, 1, attempt=2)
    assert restored.restore() == 20
    local = tmp_path / "a2-r1" / "step-00000020"
    assert sorted(os.listdir(local)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert "checkpoint at step 20 fetched" in lines[0]
    restored.upload_finished(final=True)  # what it restored is not uploaded again
    assert [c.url.split("/")[-2] for c in job.listing()] == ["attempt-1", "attempt-1"]


def test_an_old_attempts_late_upload_never_mixes_into_a_newer_ones(
    store: CheckpointStore, tmp_path: Path
) -> None:
    job = store.job(4)
    new0, _ = sync_for(job, tmp_path, 0, 1, attempt=2)
    save(tmp_path / "a2-r0", 20, 0, metadata=True)
    new0.upload_finished(final=True)
    late, _ = sync_for(job, tmp_path, 0, 2, attempt=1)  # healed host, attempt 1's rank 0
    save(tmp_path / "a1-r0", 20, 0, metadata=True)
    late.upload_finished(final=True)
    [done] = job.listing()
    assert done.url.endswith("attempt-2/step-00000020") and done.files == (
        ".metadata",
        "__0_0.distcp",
    )


def test_rank_0_prunes_the_store_to_keep_last(store: CheckpointStore, tmp_path: Path) -> None:
    job = store.job(5)
    sync, _ = sync_for(job, tmp_path, 0, 1)
    for step in (10, 20, 30, 40):
        save(tmp_path / "a1-r0", step, 0, metadata=True)
        sync.upload_finished(final=True)
    assert [c.step for c in job.listing()] == [30, 40]
    assert job.delete() and job.listing() == [] and not job.delete()


def test_links_and_forged_markers_the_program_plants_are_not_uploaded(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A rank's directory is the attacker's: a link to a file of the supervisor's is not
    followed, and a file posing as another rank's marker does not complete a save."""
    secret = tmp_path / "secret"
    secret.write_text("the service's key")
    job = store.job(9)
    sync, _ = sync_for(job, tmp_path, 0, 2)
    step_dir = save(tmp_path / "a1-r0", 10, 0, metadata=True)
    (step_dir / "stolen").symlink_to(secret)
    (step_dir / ".ranks").mkdir()
    (step_dir / ".ranks" / "1-of-2").write_bytes(b"")
    sync.upload_finished(final=True)
    assert job.listing() == []  # rank 1 never uploaded
    files = job.fs.find(job.url)
    assert not any(f.endswith("stolen") for f in files)
    assert not any(f.endswith("1-of-2") for f in files)


def test_a_store_that_cannot_be_read_fails_the_restore(tmp_path: Path) -> None:
    """Starting from scratch instead would silently lose the job's work."""

    class Unreachable(JobCheckpointStore):
        def listing(self):  # type: ignore[override]
            raise ConnectionError("could not connect to the endpoint URL")

    job = Unreachable("memory://nowhere/job-1")
    sync = CheckpointSync(job, tmp_path / "r0", RankOf(1, 0, 1), 2, lambda _: None)
    with pytest.raises(ConnectionError):
        sync.restore()


def test_an_upload_that_fails_is_said_once_and_retried(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = store.job(11)
    sync, lines = sync_for(job, tmp_path, 0, 1)
    save(tmp_path / "a1-r0", 10, 0, metadata=True)
    real = job.upload

    def cut(*args: object, **kwargs: object) -> int:
        raise OSError("network is unreachable")

    monkeypatch.setattr(job, "upload", cut)
    sync.upload_finished(final=True)
    sync.upload_finished(final=True)
    assert sum("could not be uploaded" in line for line in lines) == 1
    monkeypatch.setattr(job, "upload", real)
    sync.upload_finished(final=True)
    assert [c.step for c in job.listing()] == [10]


def test_while_the_program_runs_only_the_steps_it_reported_are_uploaded(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A script that saves straight into `step-N` is not caught mid-write: until the
    program reports a checkpoint at N (or ends), step N stays on the host."""
    job = store.job(12)
    sync, _ = sync_for(job, tmp_path, 0, 1)
    save(tmp_path / "a1-r0", 10, 0, metadata=True)
    save(tmp_path / "a1-r0", 20, 0, metadata=True)
    (tmp_path / "a1-r0" / "step-30").mkdir()  # not a name a save makes: never uploaded
    sync.upload_finished()
    assert job.listing() == []
    sync.notify(10)
    sync.upload_finished()
    assert [c.step for c in job.listing()] == [10]
    sync.finish()  # the program ended: everything it left
    assert [c.step for c in job.listing()] == [10, 20]
    assert (tmp_path / "a1-r0" / "step-30").exists()


def test_a_folder_swapped_for_a_fifo_or_a_link_is_skipped_not_waited_on(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """The program owns its directory: a FIFO or a link where a folder was listed would
    block or redirect a walk that opens folders by name. Neither is read; nor is a file
    past the size it had when it was opened."""
    secret = tmp_path / "host-secrets"
    secret.mkdir()
    (secret / "key").write_text("the service's key")
    job = store.job(13)
    sync, _ = sync_for(job, tmp_path, 0, 1)
    step_dir = save(tmp_path / "a1-r0", 10, 0, metadata=True)
    os.mkfifo(step_dir / "pipe")
    (step_dir / "linked").symlink_to(secret, target_is_directory=True)
    nested = step_dir / "nested"
    nested.mkdir()
    os.mkfifo(nested / "inner-pipe")
    sync.upload_finished(final=True)
    [done] = job.listing()
    assert done.files == (".metadata", "__0_0.distcp")


def test_a_missing_bucket_is_an_error_not_an_empty_store(tmp_path: Path) -> None:
    """Read as "no checkpoint yet", it would restart the job from scratch."""
    job = CheckpointStore(f"file://{tmp_path}/no-such-dir").job(1)
    assert job.listing() == []  # a prefix with nothing yet is empty
    store = CheckpointStore("memory://exists")

    class Broken(JobCheckpointStore):
        def _scan(self):  # type: ignore[override]
            raise FileNotFoundError("The specified bucket does not exist")

    with pytest.raises(FileNotFoundError):
        CheckpointSync(
            Broken(store.job_url(1)), tmp_path / "r", RankOf(1, 0, 1), 2, print
        ).restore()
