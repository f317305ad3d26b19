"""Pack a working directory into a deterministic zip, named by its sha256.

The same tree always gives the same bytes (entries sorted, fixed timestamps and modes), so
the hash is the package's id: a client asks the service whether it has it and uploads only
when it does not, and a second job from an unchanged directory uploads nothing. Files that
`.gitignore` or `.gangwayignore` (gitignore syntax, read by `pathspec`) exclude are left
out, and so is `.git/`. Every entry sits under one top-level folder, because Ray strips a
lone top-level folder when it unpacks a `working_dir` zip: this way the folder it strips is
always ours, never the user's.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pathspec

# Determined caps a context directory at 95 MiB and Ray's job upload is 100 MiB.
DEFAULT_MAX_BYTES = 95 * 1024 * 1024
# What a package may unpack to on a node: its entries' declared sizes and their number.
DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_FILES = 20_000
IGNORE_FILES = (".gitignore", ".gangwayignore")
TOP_LEVEL = "workdir"
# 1980-01-01, the earliest time a zip entry can hold.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


class PackageTooLarge(ValueError):
    """The directory packs to more than the limit; the message names it and the biggest
    files, so the user knows what to ignore."""


@dataclass(frozen=True)
class Package:
    sha256: str
    data: bytes
    files: int


@dataclass(frozen=True)
class Shipped:
    """A working directory on the service: its package id and the bytes this client sent
    for it (0: the service had it already)."""

    sha256: str
    bytes_sent: int


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = [".git/"]
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines += path.read_text().splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def included_files(root: Path) -> list[str]:
    """Relative POSIX paths of the files to ship, sorted. Nested ignore files are not read;
    the root's apply to the whole tree."""
    spec = _ignore_spec(root)
    found: list[str] = []
    for directory, dirs, files in os.walk(root):
        relative_dir = Path(directory).relative_to(root)
        dirs[:] = [d for d in dirs if not spec.match_file(f"{(relative_dir / d).as_posix()}/")]
        for name in files:
            relative = (relative_dir / name).as_posix()
            if not spec.match_file(relative) and (Path(directory) / name).is_file():
                found.append(relative)
    return sorted(found)


def pack(root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Package:
    """Zip `root` as described above; PackageTooLarge past `max_bytes` (of the zip)."""
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"working directory {str(root)!r} is not a directory")
    names = included_files(root)
    _check_raw_size(root, names, max_bytes)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            source = root / name
            entry = zipfile.ZipInfo(f"{TOP_LEVEL}/{name}", date_time=FIXED_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            executable = os.access(source, os.X_OK)
            entry.external_attr = (0o100755 if executable else 0o100644) << 16
            archive.writestr(entry, source.read_bytes())
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise PackageTooLarge(
            f"the working directory packs to {len(data)} bytes, over the limit of "
            f"{max_bytes} bytes; list what the job does not need in .gangwayignore"
        )
    return Package(hashlib.sha256(data).hexdigest(), data, len(names))


def _check_raw_size(root: Path, names: list[str], max_bytes: int) -> None:
    """Refuse early when the files alone are far past the limit (compression rarely wins
    10x), naming the biggest ones, before reading them all into memory."""
    sizes = sorted(((root / n).stat().st_size, n) for n in names)
    total = sum(size for size, _ in sizes)
    if total > 10 * max_bytes:
        biggest = ", ".join(f"{n} ({size} bytes)" for size, n in reversed(sizes[-3:]))
        raise PackageTooLarge(
            f"the working directory holds {total} bytes, far over the limit of {max_bytes} "
            f"bytes; the biggest files: {biggest}; list what the job does not need in "
            ".gangwayignore"
        )


# -- what a package may unpack to -------------------------------------------------------


class ZipRefused(ValueError):
    """A package that is not to be unpacked; the message says why in a user's words."""


class ZipTooLarge(ZipRefused):
    """It declares more bytes unpacked, or more entries, than allowed (`limit` says which)."""

    def __init__(self, message: str, *, limit: Literal["unpacked_bytes", "files"]) -> None:
        super().__init__(message)
        self.limit = limit


class ZipInvalid(ZipRefused):
    """Not a zip, or an entry that would be written outside the directory it is unpacked
    into (an absolute path, a '..' component, a backslash) or as a symbolic link."""


@dataclass(frozen=True)
class ZipSummary:
    """What a zip's central directory declares: its entries and their unpacked bytes."""

    entries: int
    unpacked_bytes: int


# Central directory bytes allowed per allowed entry (a 46-byte header, the path, extra
# fields): far above a real package's, and it bounds what listing a hostile one costs.
CENTRAL_BYTES_PER_ENTRY = 1024
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_NAME_SHOWN = 200


def check_zip(path: Path, *, max_unpacked_bytes: int, max_files: int) -> ZipSummary:
    """Read the zip's central directory, never its contents, and refuse what must not be
    unpacked on a node: ZipTooLarge past either limit, ZipInvalid for what is not a zip
    or holds an entry that escapes its directory or is a symbolic link.

    The sizes are the ones the zip declares: whoever unpacks it must still count the
    bytes it writes, since a declared size can lie. The directory's own size is bounded
    first, so a hostile listing costs little memory."""
    _check_directory_bytes(path, max_files)
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, struct.error) as exc:
        raise ZipInvalid(f"not a readable zip file: {exc}") from exc
    if len(entries) > max_files:
        raise ZipTooLarge(
            f"the package holds {len(entries)} entries; at most {max_files}", limit="files"
        )
    for entry in entries:
        _check_entry(entry)
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > max_unpacked_bytes:
        raise ZipTooLarge(
            f"the package unpacks to {unpacked} bytes; at most {max_unpacked_bytes}",
            limit="unpacked_bytes",
        )
    return ZipSummary(entries=len(entries), unpacked_bytes=unpacked)


def _check_entry(entry: zipfile.ZipInfo) -> None:
    """An entry lands inside the directory it is unpacked into, as a file or a folder."""
    name = entry.filename
    shown = repr(name[:_NAME_SHOWN])
    if name.startswith("/"):
        raise ZipInvalid(f"entry {shown} is an absolute path")
    if ".." in name.split("/"):
        raise ZipInvalid(f"entry {shown} has a '..' component")
    if "\\" in name:
        raise ZipInvalid(f"entry {shown} has a backslash (zip paths are separated by '/')")
    if stat.S_ISLNK(entry.external_attr >> 16):
        raise ZipInvalid(f"entry {shown} is a symbolic link")


def _check_directory_bytes(path: Path, max_files: int) -> None:
    """`zipfile` reads the whole central directory into objects before anyone can count
    them: refuse one far larger than `max_files` entries need, by its declared size."""
    size = _directory_bytes(path)
    if size > max_files * CENTRAL_BYTES_PER_ENTRY:
        raise ZipTooLarge(
            f"the package's central directory is {size} bytes, more than {max_files} entries take",
            limit="files",
        )


def _directory_bytes(path: Path) -> int:
    """The central directory's size as the end records say, read where zipfile reads
    them: the last end record signature within the final 64 KiB, and a ZIP64 record
    (just before its locator, just before the end record) overriding it when present."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        start = max(0, end - _EOCD.size - 0xFFFF)
        handle.seek(start)
        tail = handle.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            raise ZipInvalid("not a zip file: no end of central directory record")
        size: int = _EOCD.unpack_from(tail, at)[5]
        record_at = start + at - _ZIP64_LOCATOR.size - _ZIP64_EOCD.size
        if record_at < 0:
            return size
        handle.seek(record_at)
        record = handle.read(_ZIP64_EOCD.size + _ZIP64_LOCATOR.size)
    locator = _ZIP64_LOCATOR.unpack_from(record, _ZIP64_EOCD.size)
    fields = _ZIP64_EOCD.unpack_from(record)
    if locator[0] == b"PK\x06\x07" and fields[0] == b"PK\x06\x06":
        return int(fields[8])
    return size
