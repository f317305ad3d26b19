"""What the rank supervisor does with files the job controls: a shipped zip it unpacks
(bombs, paths out of the folder, links) and an outputs folder it collects (links, FIFOs,
files that grow, the quota). The zips are crafted as an attacker would, not packed by
the client."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from gangway.packaging import pack
from workers.launch import RankLimits
from workers.supervisor.outputs import PARTIAL_SUFFIX, collect
from workers.supervisor.workspace import WorkspaceError, unpacked_package

LIMITS = RankLimits(unpacked_bytes=1 << 20, unpacked_files=50)


def stored(
    tmp_path: Path, entries: dict[str, bytes], links: tuple[str, ...] = ()
) -> tuple[str, Path]:
    """A zip of `entries` (and symlink entries `links`), stored by its sha256."""
    import hashlib

    path = tmp_path / "upload.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/shadow")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return sha, path.rename(tmp_path / f"{sha}.zip")


def test_a_packed_directory_unpacks_once_read_only_to_others(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "mod.py").write_text("X = 1\n")
    (work / "run.sh").write_text("echo hi\n")
    (work / "run.sh").chmod(0o755)
    package = pack(work)
    node = tmp_path / "node"
    fetched: list[int] = []

    def fetch() -> bytes:
        fetched.append(1)
        return package.data

    target = unpacked_package(node, package.sha256, fetch, LIMITS)
    assert (target / "pkg" / "mod.py").read_text() == "X = 1\n"  # the top folder stripped
    assert stat.S_IMODE((target / "pkg" / "mod.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755
    again = unpacked_package(node, package.sha256, fetch, LIMITS)
    assert again == target and len(fetched) == 1  # fetched once per node
    assert not list((node / "packages").glob(".*"))  # no zip or partial folder left


def test_a_zip_bomb_stops_at_the_limit_counted_as_written(tmp_path: Path) -> None:
    sha, path = stored(tmp_path, {"top/zeros.bin": b"\0" * (4 << 20)})  # ~4 KiB compressed
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(WorkspaceError, match="more than the limit"):
        unpacked_package(tmp_path / "node", sha, path.read_bytes, LIMITS)
    assert not (tmp_path / "node" / "packages" / sha).exists()
    assert not list((tmp_path / "node" / "packages").glob(".*partial"))


def test_too_many_files_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    sha, path = stored(tmp_path, {f"top/f{i}": b"x" for i in range(60)})
    with pytest.raises(WorkspaceError, match="60 entries"):
        unpacked_package(tmp_path / "node", sha, path.read_bytes, LIMITS)


@pytest.mark.parametrize(
    "name", ["../escape.txt", "top/../../escape.txt", "/etc/cron.d/evil", "top/a\\..\\..\\x"]
)
def test_a_path_out_of_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    sha, path = stored(tmp_path, {"top/ok.txt": b"ok", name: b"evil"})
    with pytest.raises(WorkspaceError, match="unsafe path"):
        unpacked_package(tmp_path / "node", sha, path.read_bytes, LIMITS)
    assert (
        not (tmp_path / "escape.txt").exists() and not (tmp_path / "node" / "escape.txt").exists()
    )


def test_a_link_entry_is_refused(tmp_path: Path) -> None:
    sha, path = stored(tmp_path, {"top/ok.txt": b"ok"}, links=("top/shadow",))
    with pytest.raises(WorkspaceError, match="link"):
        unpacked_package(tmp_path / "node", sha, path.read_bytes, LIMITS)


def test_a_zip_not_named_by_its_hash_is_refused(tmp_path: Path) -> None:
    _sha, path = stored(tmp_path, {"top/ok.txt": b"ok"})
    with pytest.raises(WorkspaceError, match="does not hash"):
        unpacked_package(tmp_path / "node", "0" * 64, path.read_bytes, LIMITS)


def test_outputs_are_copied_with_links_and_special_files_left_behind(tmp_path: Path) -> None:
    source, target = tmp_path / "outputs", tmp_path / "store" / "rank-0"
    (source / "sub").mkdir(parents=True)
    (source / "model.pt").write_bytes(b"weights")
    (source / "sub" / "log.txt").write_text("done")
    (tmp_path / "secret").write_text("the service's")
    (source / "steal").symlink_to(tmp_path / "secret")
    (source / "steal_dir").symlink_to(tmp_path)
    os.mkfifo(source / "fifo")
    (source / f"half{PARTIAL_SUFFIX}").write_text("x")
    done = collect(source, target, max_bytes=1 << 20)
    kept = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert kept == ["model.pt", "sub/log.txt"]
    assert (
        done.files == 2 and done.skipped >= 3
    )  # the links (a dir link is not walked), FIFO, partial
    assert (target / "model.pt").read_bytes() == b"weights"
    again = collect(source, target, max_bytes=1 << 20)
    assert (again.files, again.unchanged) == (0, 2)


def test_outputs_past_the_quota_are_left_out(tmp_path: Path) -> None:
    source, target = tmp_path / "outputs", tmp_path / "store"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a" * 600)
    (source / "b.bin").write_bytes(b"b" * 600)
    done = collect(source, target, max_bytes=1000)
    assert (done.files, done.over_quota, done.bytes) == (1, 1, 600)
    assert len(list(target.iterdir())) == 1
    assert "left out (over the outputs quota)" in done.summary()
