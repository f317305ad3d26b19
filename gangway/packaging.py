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
import zipfile
from dataclasses import dataclass
from pathlib import Path

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
