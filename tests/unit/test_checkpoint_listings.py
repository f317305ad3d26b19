"""Checkpoint listings are cached per directory and done again only when a `step-*` entry
came, went or changed; a directory that changed within the last moments is not trusted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from workers import checkpoint_layout
from workers.checkpoint_layout import ListingCache, partial_path

LATER = 3600.0  # seconds after every file here was written: all has settled


def later() -> float:
    return time.time() + LATER


def save(directory: Path, step: int, *, complete: bool = True) -> Path:
    """Like the Checkpointer: written under a partial name, renamed into place."""
    partial = partial_path(directory, step)
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(b"x" * step)
    if complete:
        (partial / ".metadata").write_bytes(b"m")
    final = directory / f"step-{step:08d}"
    partial.rename(final)
    return final


def age(path: Path, seconds: float = 60.0) -> None:
    """Back-date a directory's mtime, so that the next change is sure to move it."""
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every real listing (the walk over each checkpoint's files) from here on."""
    done: list[Path] = []
    original = checkpoint_layout.listing

    def counting(directory: Path) -> list[checkpoint_layout.CheckpointFiles]:
        done.append(directory)
        return original(directory)

    monkeypatch.setattr(checkpoint_layout, "listing", counting)
    return done


def steps(cache: ListingCache, directory: Path) -> list[int]:
    return [c.step for c in cache.listing(directory)]


def test_an_unchanged_directory_is_listed_once(tmp_path: Path, listings: list[Path]) -> None:
    cache = ListingCache(clock=later)
    save(tmp_path, 10)
    save(tmp_path, 20)
    assert steps(cache, tmp_path) == [10, 20]
    assert steps(cache, tmp_path) == [10, 20]
    assert [c.bytes for c in cache.listing(tmp_path)] == [11, 21]
    assert len(listings) == 1


def test_a_save_or_a_prune_lists_again(tmp_path: Path, listings: list[Path]) -> None:
    cache = ListingCache(clock=later)
    old = save(tmp_path, 10)
    assert steps(cache, tmp_path) == [10]
    save(tmp_path, 20)
    assert steps(cache, tmp_path) == [10, 20]
    for path in old.iterdir():
        path.unlink()
    old.rmdir()
    assert steps(cache, tmp_path) == [20]
    assert steps(cache, tmp_path) == [20]
    assert len(listings) == 3


def test_a_checkpoint_completed_in_place_is_seen(tmp_path: Path) -> None:
    """Written in place (a script's own DCP save): `.metadata` comes last, into the step
    directory, whose mtime then moves."""
    cache = ListingCache(clock=later)
    in_place = save(tmp_path, 30, complete=False)
    age(in_place)
    assert steps(cache, tmp_path) == []
    (in_place / ".metadata").write_bytes(b"m")
    assert steps(cache, tmp_path) == [30]


def test_junk_and_a_missing_directory(tmp_path: Path) -> None:
    cache = ListingCache(clock=later)
    assert cache.listing(tmp_path / "none") == []
    save(tmp_path, 10)
    (tmp_path / "step-abc").mkdir()
    (tmp_path / "step-").mkdir()
    (tmp_path / "step-00000040").write_text("a file, not a directory")
    partial_path(tmp_path, 50).mkdir()
    assert steps(cache, tmp_path) == [10]
    assert steps(cache, tmp_path) == [10]


def test_a_directory_that_just_changed_is_not_trusted(tmp_path: Path, listings: list[Path]) -> None:
    """A file system's mtime ticks coarsely: a change in the tick just read would not
    move it, so a listing is cached only once every entry is older than `settle_s`."""
    cache = ListingCache(settle_s=600.0)
    save(tmp_path, 10)
    steps(cache, tmp_path)
    steps(cache, tmp_path)
    assert len(listings) == 2


def test_the_cache_holds_at_most_its_directories(tmp_path: Path, listings: list[Path]) -> None:
    cache = ListingCache(max_directories=2, clock=later)
    jobs = [tmp_path / f"job-{i}" for i in range(3)]
    for job in jobs:
        save(job, 1)
        cache.listing(job)
    cache.listing(jobs[1])
    cache.listing(jobs[2])
    assert len(listings) == 3
    cache.listing(jobs[0])  # dropped as the least recently read
    assert len(listings) == 4
