"""Checkpoints and outputs in an S3-compatible server (moto's, on a local port), through
s3fs as the service and the rank supervisors use it: credentials and the endpoint come
from the standard AWS variables, as on a real cluster. Then the built-in trainer on local
gloo processes, each rank saving into a directory of its own, its checkpoint carried
through the store and resumed at another data-parallel degree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.engine import run_engine
from scheduler.store.model_files import TamperedFile
from scheduler.store.registry import QuotaExceeded
from scheduler.store.remote_models import RemoteModelFiles
from scheduler.store.remote_outputs import RemoteOutputs
from workers.checkpoint_store import CheckpointStore, RankOf
from workers.engine.plan import ParallelPlan
from workers.engine.training import TrainSpec
from workers.supervisor.checkpoint_sync import CheckpointSync
from workers.supervisor.outputs import OutputsUpload, fetch_inputs


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "gangway-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "gangway-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="ckpt")
    store = CheckpointStore("s3://ckpt/gangway")
    return store


def test_two_ranks_save_and_a_new_attempt_restores_through_s3(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    job = s3_store.job(1)
    for rank in (0, 1):
        local = tmp_path / f"r{rank}" / "step-00000005"
        local.mkdir(parents=True)
        (local / f"__{rank}_0.distcp").write_bytes(b"x" * 1000)
        if rank == 0:
            (local / ".metadata").write_bytes(b"meta")
        sync = CheckpointSync(job, tmp_path / f"r{rank}", RankOf(1, rank, 2), 2, print)
        sync.upload_finished(final=True)
    [done] = job.listing()
    assert (done.step, done.bytes) == (5, 2004)
    assert done.url == "s3://ckpt/gangway/job-1/attempt-1/step-00000005"
    restore = CheckpointSync(job, tmp_path / "again", RankOf(2, 0, 1), 2, print)
    assert restore.restore() == 5
    assert (tmp_path / "again" / "step-00000005" / "__1_0.distcp").read_bytes() == b"x" * 1000
    assert job.delete() and job.listing() == []


def test_the_trainer_saves_in_each_ranks_own_directory_and_resumes_at_another_dp(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    """dp=2, each rank alone in its directory (as on hosts that share no disk), stops at
    step 3; the supervisors upload both ranks' halves; a dp=1 attempt gets the whole
    checkpoint from the store and resumes there, resharded."""
    job, spec = s3_store.job(2), TrainSpec(steps=5, batch_size=4, checkpoint_interval_steps=100)
    first = tmp_path / "first"
    stopped = run_engine(
        ParallelPlan(dp=2), spec, tmp_path / "a1", checkpoint_dir=first,
        own_checkpoint_dirs=True, stop_at=3,
    )  # fmt: skip
    assert stopped["step"] == 3
    assert (first / "rank-0" / "step-00000003" / ".metadata").is_file()
    assert not (first / "rank-1" / "step-00000003" / ".metadata").exists()  # its shard only
    for rank in (0, 1):
        CheckpointSync(job, first / f"rank-{rank}", RankOf(1, rank, 2), 2, print).upload_finished(
            final=True
        )
    assert [c.step for c in job.listing()] == [3]
    second = tmp_path / "second"
    CheckpointSync(job, second / "rank-0", RankOf(2, 0, 1), 2, print).restore()
    resumed = run_engine(
        ParallelPlan(dp=1), spec, tmp_path / "a2", checkpoint_dir=second, own_checkpoint_dirs=True
    )
    assert (resumed["resumed_from"], resumed["step"]) == (3, 5)


def test_a_bucket_that_is_not_there_fails_the_listing(s3_store: CheckpointStore) -> None:
    """A typo in GANGWAY_STORAGE_URL or a node with the wrong endpoint must not read as
    "no checkpoint yet": the job would start again from scratch."""
    with pytest.raises(FileNotFoundError):
        CheckpointStore("s3://no-such-bucket/gangway").job(1).listing()


def test_outputs_go_up_are_listed_and_served_and_come_down_as_inputs_through_s3(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    """Objects, not files: what S3 lists (keys, sizes, times), a multi-megabyte file sent
    in parts, a file streamed back, a later job's inputs fetched onto its host."""
    outputs = RemoteOutputs("s3://ckpt/outputs")
    folder = tmp_path / "rank-out"
    (folder / "deep").mkdir(parents=True)
    big = bytes(range(256)) * (6 * 4096 + 7)  # over s3fs's 5 MiB part: a multipart upload
    (folder / "deep" / "weights.bin").write_bytes(big)
    (folder / "log.txt").write_text("done")
    for rank in (0, 1):
        done = OutputsUpload(f"{outputs.job_url(7)}/rank-{rank}", 10**8).collect(folder)
        assert (done.files, done.bytes) == (2, len(big) + 4)
    listed = outputs.listing(7)
    assert [(f.path, f.rank, f.bytes) for f in listed.files] == [
        ("deep/weights.bin", 0, len(big)),
        ("log.txt", 0, 4),
    ]
    assert outputs.job_bytes(7, settled=True) == 2 * (len(big) + 4)
    found = outputs.find(7, ("deep", "weights.bin"), rank=1)
    assert found is not None and found.url == "s3://ckpt/outputs/job-7/rank-1/deep/weights.bin"
    with found.open() as opened:
        assert opened.read() == big
    outputs.fs.pipe_file("ckpt/outputs/job-7/rank-1/log.txt/x", b"")  # S3 keeps both
    said: list[str] = []
    fetched = fetch_inputs({"job-7": outputs.job_url(7)}, tmp_path / "inputs", said.append)
    assert Path(fetched["job-7"], "rank-1", "log.txt").read_text() == "done"  # the first
    assert len(said) == 1 and "rank-1/log.txt/x" in said[0]  # said, not fatal
    assert outputs.job(7).delete() and outputs.listing(7).files == []


def test_a_model_version_goes_up_with_its_digests_and_is_served_only_when_unchanged(
    s3_store: CheckpointStore, tmp_path: Path
) -> None:
    models = RemoteModelFiles("s3://ckpt/models")
    checkpoint = tmp_path / "step-00000009"
    (checkpoint / "nested").mkdir(parents=True)
    (checkpoint / ".metadata").write_bytes(b"meta")
    (checkpoint / "nested" / "__0_0.distcp").write_bytes(b"w" * 3000)
    with pytest.raises(QuotaExceeded):
        models.store(checkpoint, "gpt", 1, max_bytes=100)
    assert not models.fs.exists(models.version_url("gpt", 1))  # nothing left behind
    digests = models.store(checkpoint, "gpt", 1, max_bytes=10_000)
    assert [(d.path, d.bytes) for d in digests] == [(".metadata", 4), ("nested/__0_0.distcp", 3000)]
    path, cleanup = models.verified_copy("gpt", 1, digests[1])
    assert path.read_bytes() == b"w" * 3000
    cleanup()
    assert not path.exists()
    models.fs.pipe_file(f"{models.version_url('gpt', 1)}/.metadata", b"forged")
    with pytest.raises(TamperedFile):
        models.verified_copy("gpt", 1, digests[0])
    models.remove("gpt", 1)
    with pytest.raises(TamperedFile):  # gone
        models.verified_copy("gpt", 1, digests[1])
