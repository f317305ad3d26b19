"""An uploaded working directory is unpacked on every node that runs the job: the audit
found a 2 MB zip that unpacks to 2 GiB accepted (the size limit was on the compressed
upload only), and nothing said what shape the entries had. Refused at upload, with what
was written deleted."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.security.audit_api import audited, refusal, users

GIB = 1024**3


def zipped(entries: list[tuple[str, bytes]], *, declared: int | None = None) -> bytes:
    """A zip of `entries`; `declared`: the first entry's uncompressed size as the central
    directory states it (a bomb's claim, without deflating gigabytes here)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
        if declared is not None:
            archive.infolist()[0].file_size = declared
    return buffer.getvalue()


def with_symlink() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        link = zipfile.ZipInfo("workdir/passwd")
        link.create_system = 3
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    return buffer.getvalue()


def upload(api: TestClient, data: bytes, headers: dict[str, str]) -> httpx.Response:
    sha = hashlib.sha256(data).hexdigest()
    return api.put(f"/v1/packages/{sha}", content=data, headers=headers)


def _nothing_kept(api: TestClient, data: bytes, root: Path, headers: dict[str, str]) -> None:
    sha = hashlib.sha256(data).hexdigest()
    assert api.get(f"/v1/packages/{sha}", headers=headers).status_code == 404
    assert not root.exists() or not any(root.iterdir())  # no zip, no partial file


def test_bob_cannot_upload_a_zip_declaring_2_gib(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)
    bomb = zipped([("workdir/zeros.bin", b"\0" * 1024)], declared=2 * GIB)
    assert len(bomb) < 2 * 1024 * 1024
    answer = upload(api, bomb, bob)
    assert refusal(answer) == (413, "body"), answer.text
    assert "GANGWAY_PACKAGE_MAX_UNPACKED_BYTES" in answer.text
    _nothing_kept(api, bomb, tmp_path / "packages", bob)


def test_bob_cannot_upload_a_real_deflate_bomb(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path, package_max_unpacked_bytes=8 * 1024 * 1024)
    _, bob = users(api)
    bomb = zipped([("workdir/zeros.bin", b"\0" * (16 * 1024 * 1024))])
    assert len(bomb) < 64 * 1024
    assert refusal(upload(api, bomb, bob)) == (413, "body")
    _nothing_kept(api, bomb, tmp_path / "packages", bob)


def test_bob_cannot_upload_more_files_than_allowed(database_url: str, tmp_path: Path) -> None:
    api = audited(database_url, tmp_path, package_max_files=10)
    _, bob = users(api)
    many = zipped([(f"workdir/f{i}.txt", b"x") for i in range(11)])
    answer = upload(api, many, bob)
    assert refusal(answer) == (413, "body"), answer.text
    assert "GANGWAY_PACKAGE_MAX_FILES" in answer.text
    _nothing_kept(api, many, tmp_path / "packages", bob)
    ten = zipped([(f"workdir/f{i}.txt", b"x") for i in range(10)])
    assert upload(api, ten, bob).status_code == 201


@pytest.mark.parametrize(
    "data",
    [
        zipped([("/etc/cron.d/job", b"* * * * * root sh")]),
        zipped([("workdir/../../outside.py", b"print()")]),
        zipped([("workdir/..", b"")]),
        with_symlink(),
        b"this is not a zip at all",
    ],
    ids=["absolute", "dotdot", "dotdot-last", "symlink", "not-a-zip"],
)
def test_bob_cannot_upload_a_zip_of_the_wrong_shape(
    database_url: str, tmp_path: Path, data: bytes
) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)
    answer = upload(api, data, bob)
    assert refusal(answer) == (422, "body"), answer.text
    _nothing_kept(api, data, tmp_path / "packages", bob)
