"""`check_zip` on a table of crafted zips: what a package may declare it unpacks to, and
what shapes of entry are refused. Nothing here is unpacked."""

from __future__ import annotations

import contextlib
import io
import stat
import struct
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gangway.packaging import (
    CENTRAL_BYTES_PER_ENTRY,
    ZipInvalid,
    ZipRefused,
    ZipSummary,
    ZipTooLarge,
    check_zip,
    pack,
)

GIB = 1024**3
END = b"PK\x05\x06"  # the end of central directory record's signature
LIMITS = {"max_unpacked_bytes": GIB, "max_files": 20_000}


def zipped(*entries: zipfile.ZipInfo | tuple[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for entry in entries:
            if isinstance(entry, zipfile.ZipInfo):
                archive.writestr(entry, b"")
            else:
                archive.writestr(*entry)
    return buffer.getvalue()


def declaring(size: int, count: int = 1) -> bytes:
    """`count` one-byte entries whose central directory claims `size` bytes each."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(count):
            archive.writestr(f"workdir/f{i}", b"x")
        for info in archive.infolist():
            info.file_size = size
    return buffer.getvalue()


def entry(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = mode << 16
    return info


def check(tmp_path: Path, data: bytes, **limits: int) -> ZipSummary:
    path = tmp_path / "p.zip"
    path.write_bytes(data)
    return check_zip(path, **{**LIMITS, **limits})


def test_a_packed_directory_passes_and_is_summarised(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print(1)\n" * 100)
    (tmp_path / "src" / "data.txt").write_text("hello")
    summary = check(tmp_path, pack(tmp_path / "src").data)
    assert summary == ZipSummary(entries=2, unpacked_bytes=900 + 5)
    assert check(tmp_path, zipped()) == ZipSummary(entries=0, unpacked_bytes=0)


@pytest.mark.parametrize(
    ("data", "limits", "limit"),
    [
        (declaring(2 * GIB), {}, "unpacked_bytes"),
        (declaring(GIB // 4 + 1, count=4), {}, "unpacked_bytes"),  # one byte over, in sum
        (declaring(100, count=3), {"max_unpacked_bytes": 299}, "unpacked_bytes"),
        (zipped(*[(f"workdir/{i}", b"") for i in range(11)]), {"max_files": 10}, "files"),
        (zipped(("workdir/", b""), ("workdir/a", b"")), {"max_files": 1}, "files"),  # folders count
        # a directory far larger than its entries need is refused before it is listed
        (
            zipped(*[("workdir/" + "n" * 1500 + str(i), b"") for i in range(2)]),
            {"max_files": 2},
            "files",
        ),
    ],
    ids=["2-gib", "sum", "sum-small", "files", "folders", "directory-bytes"],
)
def test_too_much_unpacked_is_refused_naming_the_limit(
    tmp_path: Path, data: bytes, limits: dict[str, int], limit: str
) -> None:
    with pytest.raises(ZipTooLarge) as refused:
        check(tmp_path, data, **limits)
    assert refused.value.limit == limit


def test_the_limits_are_inclusive(tmp_path: Path) -> None:
    assert check(tmp_path, declaring(100, count=3), max_unpacked_bytes=300).unpacked_bytes == 300
    ten = zipped(*[(f"workdir/{i}", b"") for i in range(10)])
    assert check(tmp_path, ten, max_files=10).entries == 10
    assert len(ten) < 10 * CENTRAL_BYTES_PER_ENTRY


def test_a_zip64_directory_of_many_entries_is_counted(tmp_path: Path) -> None:
    """Past 65,535 entries the end record is ZIP64's: read too."""
    many = zipped(*[(f"{i}", b"") for i in range(70_000)])
    with pytest.raises(ZipTooLarge, match="70000 entries"):
        check(tmp_path, many)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (zipped(("/etc/cron.d/job", b"x")), "absolute path"),
        (zipped(("workdir/../../x.py", b"x")), "'..' component"),
        (zipped(("..", b"")), "'..' component"),
        (zipped(("workdir/a/..", b"")), "'..' component"),
        (zipped(("workdir\\..\\..\\x", b"x")), "backslash"),
        (zipped(entry("workdir/passwd", stat.S_IFLNK | 0o777)), "symbolic link"),
        (zipped(entry("workdir/link", stat.S_IFLNK)), "symbolic link"),
        (b"", "not a zip"),
        (b"not a zip at all", "not a zip"),
        (END + struct.pack("<4H2LH", 0, 0, 1, 1, 46, 100, 0), "not a readable zip"),  # nowhere
        (b"x" * 200 + END + struct.pack("<4H2LH", 0, 0, 1, 1, 46, 0, 0), "not a readable zip"),
        (zipped(("workdir/a", b"x" * 100))[:-30], "not a zip"),  # cut short
    ],
    ids=[
        "absolute",
        "dotdot",
        "dotdot-alone",
        "dotdot-last",
        "backslash",
        "symlink",
        "symlink-no-permissions",
        "empty",
        "text",
        "end-record-pointing-past-the-start",
        "end-record-pointing-at-no-directory",
        "truncated",
    ],
)
def test_a_wrong_shape_is_refused(tmp_path: Path, data: bytes, why: str) -> None:
    with pytest.raises(ZipInvalid, match=why):
        check(tmp_path, data)


def test_dot_dot_inside_a_name_is_fine(tmp_path: Path) -> None:
    assert check(tmp_path, zipped(("workdir/a..b/..c", b"x"))).entries == 1


@given(st.binary(max_size=512))
def test_arbitrary_bytes_are_refused_or_passed_never_crash(data: bytes) -> None:
    _refused_or_passed(data)


VALID = zipped(("workdir/a.py", b"print(1)\n"), ("workdir/b/c.txt", b"hello" * 20))


@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8))
def test_a_corrupted_zip_is_refused_or_passed_never_crash(
    flips: list[tuple[int, int]],
) -> None:
    data = bytearray(VALID)
    for at, value in flips:
        data[at] = value
    _refused_or_passed(bytes(data))


def _refused_or_passed(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.zip"
        path.write_bytes(data)
        with contextlib.suppress(ZipRefused):
            check_zip(path, max_unpacked_bytes=GIB, max_files=100)
