"""Jobs' outputs in storage named by a URL (fsspec's memory filesystem here; S3 in
tests/integration/test_checkpoint_s3.py): what the rank supervisors upload, and what the
service lists, serves, counts and deletes, with the shared folder's rules."""

from __future__ import annotations

import io
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from scheduler.store.remote_outputs import RemoteOutputs, StoreUsage
from workers.stored_files import CHUNK, PARTIAL_SUFFIX, filesystem, put_open_file
from workers.supervisor import outputs as outputs_module
from workers.supervisor.outputs import OutputsUpload, UploadIncomplete, fetch_inputs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store() -> RemoteOutputs:
    cache = StoreUsage(clock=Clock())
    return RemoteOutputs(f"memory://outputs-{uuid.uuid4().hex}/root", usage=cache)


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
    said: list[str] = []
    fetched = fetch_inputs(
        {"job-4": store.job_url(4), "job-9": store.job_url(9)}, tmp_path / "fetched", said.append
    )
    assert Path(fetched["job-4"], "rank-0", "data", "x.bin").read_bytes() == b"payload"
    assert oct(Path(fetched["job-4"], "rank-0", "data", "x.bin").stat().st_mode & 0o777) == "0o644"
    assert said == []
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


def test_every_instance_for_one_store_shares_its_totals(tmp_path: Path) -> None:
    """The API, the loop and retention each build one: a retention delete must free the
    owner's quota for the other two (a cache of their own kept it forever)."""
    url = f"memory://outputs-{uuid.uuid4().hex}/root"
    api, sweep = RemoteOutputs(url), RemoteOutputs(url)
    OutputsUpload(f"{api.job_url(1)}/rank-0", 1000).collect(written(tmp_path, {"a": b"x" * 100}))
    assert api.job_bytes(1, settled=True) == 100
    assert sweep.job(1).delete()
    assert api.job_bytes(1, settled=True) == 0


def test_a_listing_that_began_before_a_delete_keeps_nothing(store: RemoteOutputs) -> None:
    """Retention deleted the job while its total was being listed: what the listing
    counted must not stay cached as settled (the owner charged for deleted files)."""
    cache = store._usage

    def counted_then_deleted() -> int:
        cache.forget(9)  # the sweep, while the files were being listed
        return 5000

    assert cache.get(9, True, counted_then_deleted) == 5000
    assert cache.get(9, True, lambda: 0) == 0


def test_a_lister_that_died_is_started_again(store: RemoteOutputs) -> None:
    cache = store._usage

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert cache.get(1, True, interrupted, wait=False) == 0
    deadline = time.monotonic() + 5
    while cache.get(2, True, lambda: 7, wait=False) != 7:  # listed by a lister
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_loop_never_waits_for_a_total(store: RemoteOutputs) -> None:
    """Without `wait` an unknown total reads as 0 at once and is listed in the
    background; a store that hangs never holds the scheduling pass."""
    listing, release = threading.Event(), threading.Event()

    def slow_total() -> int:
        listing.set()
        release.wait(10)
        return 42

    cache = store._usage
    assert cache.get(8, True, slow_total, wait=False) == 0
    assert listing.wait(5)
    assert cache.get(8, True, slow_total, wait=False) == 0  # still listing: not twice
    release.set()
    deadline = time.monotonic() + 5
    while cache.get(8, True, slow_total, wait=False) != 42:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_file_grown_after_its_size_was_checked_goes_up_no_further(
    store: RemoteOutputs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = written(tmp_path, {"grows": b"x" * 100})
    real = outputs_module.put_open_file

    def grown_first(fs: Any, path: str, source: Any, size: int | None = None) -> int:
        with (folder / "grows").open("ab") as more:  # the program, between check and copy
            more.write(b"y" * 10_000)
        return real(fs, path, source, size=size)

    monkeypatch.setattr(outputs_module, "put_open_file", grown_first)
    _, done = upload(store, 11, 0, folder, max_bytes=1000)
    assert done.bytes == 100 and store.job_bytes(11, settled=True) == 100


@pytest.mark.parametrize("where", ["memory", "file"])
def test_an_upload_that_fails_half_way_leaves_nothing(tmp_path: Path, where: str) -> None:
    url = f"memory://fail-{uuid.uuid4().hex}" if where == "memory" else f"file://{tmp_path}/store"
    fs, path = filesystem(url)

    class Failing(io.BytesIO):
        def __init__(self) -> None:
            super().__init__(b"z" * (3 * CHUNK))
            self.reads = 0

        def fileno(self) -> int:
            return os.open(os.devnull, os.O_RDONLY)  # its size is passed, not read

        def read(self, n: int = -1) -> bytes:
            self.reads += 1
            if self.reads == 2:
                raise OSError("the disk under the program's file failed")
            return super().read(n)

    with pytest.raises(OSError, match="disk"):
        put_open_file(fs, f"{path}/out/f.bin", Failing(), size=3 * CHUNK)  # type: ignore[arg-type]
    assert not fs.exists(f"{path}/out/f.bin")
    assert not fs.exists(f"{path}/out/f.bin{PARTIAL_SUFFIX}")
    assert put_open_file(fs, f"{path}/out/g.bin", Readable(b"ok"), size=2) == 2
    with pytest.raises(OSError, match="disk"):  # a new copy that fails keeps the old one
        put_open_file(fs, f"{path}/out/g.bin", Failing(), size=3 * CHUNK)  # type: ignore[arg-type]
    assert fs.cat_file(f"{path}/out/g.bin") == b"ok"


class Readable(io.BytesIO):
    def fileno(self) -> int:
        return os.open(os.devnull, os.O_RDONLY)


def test_a_file_and_a_folder_of_one_name_replace_each_other(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    """The program's folder holds one of them at a time; the store must too, or no
    folder could take its files (a later job's inputs_from failed on it)."""
    (tmp_path / "foo").write_bytes(b"file")
    sink, _ = upload(store, 12, 0, tmp_path)
    (tmp_path / "foo").unlink()
    written(tmp_path, {"foo/bar": b"in a folder"})
    sink.collect(tmp_path)
    assert [f.path for f in store.listing(12).files] == ["foo/bar"]
    shutil.rmtree(tmp_path / "foo")
    (tmp_path / "foo").write_bytes(b"a file again")
    sink.collect(tmp_path)
    assert [(f.path, f.bytes) for f in store.listing(12).files] == [("foo", 12)]
    assert store.job_bytes(12, settled=False) == 12


def test_one_file_that_cannot_go_up_does_not_stop_the_others(
    store: RemoteOutputs, tmp_path: Path
) -> None:
    deep = "/".join(["d" * 200] * 5) + "/long.txt"  # a key past S3's 1,024 bytes
    folder = written(tmp_path, {"a.txt": b"a", "b.txt": b"b", deep: b"l", "x?versionId=1": b"v"})
    sink = OutputsUpload(f"{store.job_url(14)}/rank-0", 10**6, fs=Refusing())
    with pytest.raises(UploadIncomplete, match="1 file") as failed:
        sink.collect(folder)
    assert (failed.value.done.files, failed.value.done.skipped) == (1, 2)
    assert [f.path for f in store.listing(14).files] == ["b.txt"]
    assert store.find(14, ("x?versionId=1",)) is None


class Refusing(MemoryFileSystem):
    """A store that refuses one name (a permission, a transient error)."""

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "/a.txt" in path and "w" in mode:
            raise PermissionError("AccessDenied")
        return super().open(path, mode, **kwargs)
