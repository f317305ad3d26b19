"""Jobs' outputs in storage named by a URL (fsspec's memory filesystem here; S3 in
tests/integration/test_checkpoint_s3.py): what the rank supervisors upload, and what the
service lists, serves, counts and deletes, with the shared folder's rules."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from scheduler.store.outputs import PARTIAL_SUFFIX
from scheduler.store.remote_outputs import RemoteOutputs
from workers.supervisor.outputs import OutputsUpload, fetch_inputs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store() -> RemoteOutputs:
    return RemoteOutputs(f"memory://outputs-{uuid.uuid4().hex}/root", clock=Clock())


def written(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def upload(store: RemoteOutputs, job_id: int, rank: int, folder: Path, max_bytes: int = 10**6):
    sink = OutputsUpload(f"{store.job_url(job_id)}/rank-{rank}", max_bytes)
    return sink, sink.collect(folder)


def test_two_ranks_upload_and_the_merged_view_takes_the_lowest_ranks_copy(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    zero = written(tmp_path / "r0", {"model.pt": b"rank zero", "metrics/loss.csv": b"1,2"})
    one = written(tmp_path / "r1", {"model.pt": b"rank one!!", "only-1.txt": b"one"})
    os.symlink("/etc/passwd", zero / "link.txt")  # never followed
    os.mkfifo(zero / "pipe")  # never waited on
    (zero / ("half" + PARTIAL_SUFFIX)).write_bytes(b"x")  # a name the store never shows
    _, done = upload(store, 5, 0, zero)
    assert (done.files, done.bytes, done.skipped) == (2, 12, 3)
    upload(store, 5, 1, one)
    merged = store.listing(5)
    assert [(f.path, f.rank, f.bytes) for f in merged.files] == [
        ("metrics/loss.csv", 0, 3),
        ("model.pt", 0, 9),
        ("only-1.txt", 1, 3),
    ]
    assert [f.path for f in store.listing(5, rank=1).files] == ["model.pt", "only-1.txt"]
    found = store.find(5, ("model.pt",))
    assert found is not None and found.entry.rank == 0
    with found.open() as opened:
        assert opened.read() == b"rank zero"
    ranked = store.find(5, ("model.pt",), rank=1)
    assert ranked is not None and ranked.open().read() == b"rank one!!"
    assert store.find(5, ("link.txt",)) is None and store.find(5, ("metrics",)) is None
    assert store.find(6, ("model.pt",)) is None and store.listing(6).files == []


def test_listings_page_by_cursor_in_component_order(store: RemoteOutputs, tmp_path: Path) -> None:
    names = ["a/z.txt", "a.txt", "b/c/d.txt", "b/c.txt", "e"]
    upload(store, 1, 0, written(tmp_path, {n: b"." for n in names}))
    seen, cursor = [], ()
    while True:
        page = store.listing(1, after=cursor, limit=2)
        seen += [f.path for f in page.files]
        if page.next_cursor is None:
            break
        cursor = tuple(page.next_cursor.split("/"))
    assert seen == ["a/z.txt", "a.txt", "b/c/d.txt", "b/c.txt", "e"]  # as the folder's walk


def test_an_unchanged_file_is_not_sent_again_and_the_quota_counts_each_file_once(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    folder = written(tmp_path, {"a": b"x" * 40, "b": b"y" * 40})
    sink, first = upload(store, 2, 0, folder, max_bytes=100)
    assert (first.files, first.over_quota) == (2, 0)
    again = sink.collect(folder)
    assert (again.files, again.unchanged) == (0, 2)
    (folder / "a").write_bytes(b"x" * 50)  # replaced: counts once, at its new size
    os.utime(folder / "a", ns=(1, 1))
    (folder / "c").write_bytes(b"z" * 20)  # 50 + 40 + 20 > 100
    later = sink.collect(folder)
    assert (later.files, later.over_quota) == (1, 1)
    assert store.job_bytes(2, settled=False) == 90


def test_a_jobs_total_is_cached_until_stale_or_deleted(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    clock = store._usage._clock
    assert isinstance(clock, Clock)
    sink, _ = upload(store, 3, 0, written(tmp_path, {"a": b"x" * 10}))
    assert store.job_bytes(3, settled=False) == 10
    written(tmp_path, {"b": b"y" * 5})
    sink.collect(tmp_path)
    assert store.job_bytes(3, settled=False) == 10  # not listed again yet
    clock.now += 31
    assert store.job_bytes(3, settled=True) == 15
    clock.now += 10_000
    assert store.job_bytes(3, settled=True) == 15  # settled: trusted
    assert store.job(3).delete() and not store.job(3).delete()
    assert store.job_bytes(3, settled=True) == 0  # retention forgot its total


def test_inputs_are_fetched_whole_and_a_job_without_outputs_is_an_empty_folder(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    upload(store, 4, 0, written(tmp_path / "src", {"data/x.bin": b"payload"}))
    fetched = fetch_inputs(
        {"job-4": store.job_url(4), "job-9": store.job_url(9)}, tmp_path / "fetched"
    )
    assert Path(fetched["job-4"], "rank-0", "data", "x.bin").read_bytes() == b"payload"
    assert list(Path(fetched["job-9"]).iterdir()) == []


def test_a_store_that_cannot_be_reached_raises_instead_of_listing_nothing(tmp_path: Path) -> None:
    unreachable = RemoteOutputs("memory://x", fs=Broken())
    with pytest.raises(ConnectionError):
        unreachable.listing(1)
    with pytest.raises(ConnectionError):
        unreachable.job_bytes(1, settled=True)


class Broken(MemoryFileSystem):
    def find(self, *args: object, **kwargs: object) -> dict[str, object]:
        raise ConnectionError("could not connect to the endpoint URL")
