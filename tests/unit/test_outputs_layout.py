"""Jobs' outputs as stored (`<root>/job-<id>/rank-<r>/...`): what a listing shows, in what
order and in pages, which file a download reads, and which paths are refused outright."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gangway.paths import MAX_NAME_BYTES, MAX_PATH_CHARS, BadPath, path_parts
from scheduler.store.outputs import (
    PARTIAL_SUFFIX,
    find_output,
    job_bytes,
    job_outputs_dir,
    list_outputs,
    rank_outputs_dir,
    ranks,
)

JOB = 7


def put(root: Path, rank: int, path: str, data: bytes = b"x") -> Path:
    """A file as the rank supervisor leaves it once its copy is complete."""
    target = rank_outputs_dir(root, JOB, rank) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def listed(
    root: Path, *, rank: int | None = None, after: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    page = list_outputs(root, JOB, rank=rank, after=after, limit=10_000)
    return [(f.path, f.rank) for f in page.files]


def test_the_merged_view_shows_each_path_once_from_the_lowest_rank(tmp_path: Path) -> None:
    put(tmp_path, 0, "model.pt", b"zero")
    put(tmp_path, 1, "model.pt", b"one!")
    put(tmp_path, 1, "only-on-1.txt")
    put(tmp_path, 10, "model.pt")
    put(tmp_path, 2, "logs/rank2.txt")
    assert ranks(tmp_path, JOB) == [0, 1, 2, 10]  # numerically, not by name
    assert listed(tmp_path) == [
        ("logs/rank2.txt", 2),
        ("model.pt", 0),
        ("only-on-1.txt", 1),
    ]
    assert listed(tmp_path, rank=1) == [("model.pt", 1), ("only-on-1.txt", 1)]
    assert listed(tmp_path, rank=5) == []
    found = find_output(tmp_path, JOB, ("model.pt",))
    assert found is not None and found.entry.rank == 0 and found.path.read_bytes() == b"zero"
    found = find_output(tmp_path, JOB, ("model.pt",), rank=1)
    assert found is not None and found.path.read_bytes() == b"one!"
    assert find_output(tmp_path, JOB, ("only-on-1.txt",), rank=0) is None


def test_copies_in_progress_symlinks_and_folders_are_neither_listed_nor_found(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours")
    put(tmp_path, 0, "kept.txt")
    put(tmp_path, 0, "model.pt" + PARTIAL_SUFFIX)
    put(tmp_path, 0, "half" + PARTIAL_SUFFIX + "/inside.txt")
    base = rank_outputs_dir(tmp_path, JOB, 0)
    (base / "link.txt").symlink_to(secret)
    (base / "linked-dir").symlink_to(tmp_path)
    (base / "sub").mkdir()
    rank1 = rank_outputs_dir(tmp_path, JOB, 1)
    rank1.parent.mkdir(parents=True, exist_ok=True)
    rank1.symlink_to(tmp_path)  # a whole rank folder that is a symlink
    assert listed(tmp_path) == [("kept.txt", 0)]
    assert ranks(tmp_path, JOB) == [0]
    for parts in (
        ("model.pt" + PARTIAL_SUFFIX,),
        ("half" + PARTIAL_SUFFIX, "inside.txt"),
        ("link.txt",),
        ("linked-dir", "secret.txt"),
        ("sub",),
        ("missing",),
    ):
        assert find_output(tmp_path, JOB, parts) is None, parts
    assert find_output(tmp_path, JOB, ("secret.txt",), rank=1) is None


def test_a_job_folder_that_is_a_symlink_shows_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "rank-0").mkdir(parents=True)
    (elsewhere / "rank-0" / "f").write_bytes(b"x")
    (tmp_path / "outputs").mkdir()
    job_outputs_dir(tmp_path / "outputs", JOB).symlink_to(elsewhere)
    assert list_outputs(tmp_path / "outputs", JOB).files == []
    assert list_outputs(tmp_path / "outputs", JOB, rank=0).files == []
    assert find_output(tmp_path / "outputs", JOB, ("f",), rank=0) is None
    assert job_bytes(tmp_path / "outputs", JOB) == 0


def test_pages_follow_the_cursor_in_path_order_without_repeats(tmp_path: Path) -> None:
    names = [f"d{d}/f{f:03d}" for d in range(3) for f in range(40)] + ["d1-x", "d1.txt", "e"]
    for i, name in enumerate(names):
        put(tmp_path, i % 3, name)
    put(tmp_path, 2, "d0/f000")  # also on a higher rank: shown once
    seen: list[str] = []
    after: tuple[str, ...] = ()
    while True:
        page = list_outputs(tmp_path, JOB, after=after, limit=7)
        seen.extend(f.path for f in page.files)
        if page.next_cursor is None:
            break
        assert page.next_cursor == page.files[-1].path
        after = tuple(page.next_cursor.split("/"))
    # Component order: the folder d1's files before "d1-x" (string order would differ).
    assert seen == sorted(names, key=lambda n: n.split("/"))
    assert seen.index("d1/f039") < seen.index("d1-x")


def test_a_cursor_from_another_rank_or_naming_a_folder_resumes_after_it(tmp_path: Path) -> None:
    put(tmp_path, 0, "a")
    put(tmp_path, 1, "b/c")
    put(tmp_path, 1, "b/d")
    put(tmp_path, 0, "e")
    assert listed(tmp_path, after=("b",)) == [("b/c", 1), ("b/d", 1), ("e", 0)]
    assert listed(tmp_path, after=("b", "c")) == [("b/d", 1), ("e", 0)]
    assert listed(tmp_path, after=("b", "c", "zz")) == [("b/d", 1), ("e", 0)]
    assert listed(tmp_path, after=("zzz",)) == []


def test_folders_deeper_than_pythons_recursion_limit_are_listed(tmp_path: Path) -> None:
    folder = rank_outputs_dir(tmp_path, JOB, 0)
    folder.mkdir(parents=True)
    for _ in range(1100):  # one at a time: Path.mkdir(parents=True) recurses itself
        folder = folder / "d"
        folder.mkdir()
    (folder / "leaf.txt").write_bytes(b"x")
    deep = "/".join(["d"] * 1100) + "/leaf.txt"
    try:
        assert listed(tmp_path) == [(deep, 0)]
        assert job_bytes(tmp_path, JOB) == 1
    finally:  # pytest's own clean-up of old temp folders recurses, and would fail on it
        subprocess.run(["rm", "-rf", str(tmp_path / f"job-{JOB}")], check=True)


def test_a_name_that_is_not_utf8_is_skipped(tmp_path: Path) -> None:
    put(tmp_path, 0, "ok.txt")
    folder = os.fsencode(rank_outputs_dir(tmp_path, JOB, 0))
    with open(os.path.join(folder, b"bad-\xff.txt"), "wb") as raw:
        raw.write(b"x")
    assert listed(tmp_path) == [("ok.txt", 0)]


def test_job_bytes_counts_every_ranks_files_and_copies_in_progress(tmp_path: Path) -> None:
    put(tmp_path, 0, "a", b"12345")
    put(tmp_path, 1, "a", b"123")
    put(tmp_path, 1, "deep/b" + PARTIAL_SUFFIX, b"12")
    (rank_outputs_dir(tmp_path, JOB, 0) / "big-link").symlink_to("/dev/zero")
    assert job_bytes(tmp_path, JOB) == 10
    assert job_bytes(tmp_path, JOB + 1) == 0


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../secret",
        "a/../../b",
        "a/./b",
        ".",
        "a//b",
        "a/",
        "a\x00b",
        "x" * (MAX_PATH_CHARS + 1),
        "y" * (MAX_NAME_BYTES + 1),
        "\udcff",
    ],
)
def test_paths_that_can_never_name_an_output_are_refused(path: str) -> None:
    with pytest.raises(BadPath):
        path_parts(path)


def test_ordinary_paths_are_split_into_components() -> None:
    assert path_parts("model.pt") == ("model.pt",)
    assert path_parts("logs/rank 0/é..txt") == ("logs", "rank 0", "é..txt")
    assert path_parts("a\\b") == ("a\\b",)  # a backslash is part of a POSIX name
