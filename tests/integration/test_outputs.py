"""A job's outputs through the real app and database (SQLite and PostgreSQL), with auth on:
REST, both SDK clients and the CLI over files laid out by hand as the rank supervisors
will (`<root>/job-<id>/rank-<r>/...`), the owner's quota, and the retention sweep."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pydantic
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from api.app import create_app
from api.auth import AuthConfig
from api.limits import Limits
from api.server import build_app
from api.settings import Settings
from gangway import AsyncClient, Client, Forbidden, NotFound, ValidationFailed
from gangway.models import JobSubmit
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, NewJob
from scheduler.store.artifact_retention import ArtifactRetention, ArtifactSweeper
from scheduler.store.output_stores import LocalOutputs
from scheduler.store.output_usage import storage_usage
from scheduler.store.outputs import PARTIAL_SUFFIX, job_outputs_dir, rank_outputs_dir
from scheduler.store.registry import ModelRegistry
from scheduler.store.remote_outputs import RemoteOutputs
from workers.checkpoint_layout import checkpoint_path, job_directory

ADMIN_KEY = "outputs-tests-bootstrap-key"
JOB = {"name": "j", "parallelism": {"dp": 2}, "entrypoint": {"kind": "builtin", "steps": 5}}
SECRET = b"the service's own secret"
MERGED = {"model.pt": b"rank zero", "metrics/loss.csv": b"1,2,3", "only-rank-1.txt": b"one"}
QUOTA = 10_000


@pytest.fixture
def outputs_root(tmp_path: Path) -> Path:
    return tmp_path / "outputs"


@pytest.fixture
def app(repo: JobRepository, outputs_root: Path) -> FastAPI:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    return create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        outputs_root=outputs_root,
        storage_quota_bytes=QUOTA,
        limits=Limits(max_page_bytes=1000),  # a few files a page: paging is exercised
    )


@pytest.fixture
def api(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


ADMIN = bearer(ADMIN_KEY)


def new_user(api: TestClient, name: str, role: str = "user") -> str:
    assert api.post("/v1/users", json={"name": name, "role": role}, headers=ADMIN).is_success
    secret: str = api.post(f"/v1/users/{name}/keys", headers=ADMIN).json()["secret"]
    return secret


def put(root: Path, job_id: int, rank: int, path: str, data: bytes) -> Path:
    target = rank_outputs_dir(root, job_id, rank) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def lay_out(root: Path, job_id: int) -> None:
    """Two ranks' outputs, as their supervisors leave them: rank 0's model.pt wins the
    merged view; a copy in progress and symlinks (which no supervisor makes) are there
    too, and must stay invisible."""
    put(root, job_id, 0, "model.pt", MERGED["model.pt"])
    put(root, job_id, 0, "metrics/loss.csv", MERGED["metrics/loss.csv"])
    put(root, job_id, 1, "model.pt", b"rank one's model")
    put(root, job_id, 1, "only-rank-1.txt", MERGED["only-rank-1.txt"])
    put(root, job_id, 0, "checkpoint.pt" + PARTIAL_SUFFIX, b"half")
    secret = root.parent / "secret.txt"
    secret.write_bytes(SECRET)
    (rank_outputs_dir(root, job_id, 0) / "link.txt").symlink_to(secret)
    (rank_outputs_dir(root, job_id, 1) / "up").symlink_to(root.parent)
    put(root, job_id, 2, "../secret-beside-ranks.txt", SECRET)  # job-<id>/secret-...


def submitted(api: TestClient, secret: str) -> int:
    response = api.post("/v1/jobs", json=JOB, headers=bearer(secret))
    assert response.status_code == 201, response.text
    job_id: int = response.json()["id"]
    return job_id


@pytest.fixture
def alice(api: TestClient, outputs_root: Path) -> tuple[str, int]:
    """alice's key and a job of hers with outputs laid out."""
    secret = new_user(api, "alice")
    job_id = submitted(api, secret)
    lay_out(outputs_root, job_id)
    return secret, job_id


def all_files(
    api: TestClient, job_id: int, headers: dict[str, str], **params: Any
) -> list[dict[str, Any]]:
    """Every page of the listing, checking each page's cursor on the way."""
    files: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = api.get(f"/v1/jobs/{job_id}/outputs", params=query, headers=headers)
        assert page.status_code == 200, page.text
        body = page.json()
        assert (body["usage"] is None) == (cursor is not None)  # the first page's only
        files.extend(body["files"])
        if body["next_cursor"] is None:
            return files
        assert body["next_cursor"] == body["files"][-1]["path"]
        cursor = body["next_cursor"]


def test_the_merged_view_takes_rank_0s_copy_and_rank_1_lists_its_own(
    api: TestClient, alice: tuple[str, int]
) -> None:
    secret, job_id = alice
    me = bearer(secret)
    merged = all_files(api, job_id, me)
    assert [(f["path"], f["rank"], f["bytes"]) for f in merged] == [
        ("metrics/loss.csv", 0, 5),
        ("model.pt", 0, 9),
        ("only-rank-1.txt", 1, 3),
    ]
    rank1 = all_files(api, job_id, me, rank=1)
    assert [(f["path"], f["rank"]) for f in rank1] == [("model.pt", 1), ("only-rank-1.txt", 1)]
    first = api.get(f"/v1/jobs/{job_id}/outputs", params={"limit": 1}, headers=me).json()
    assert first["next_cursor"] == "metrics/loss.csv"
    # Storage: every rank's files, the copy in progress too; symlinks are not followed,
    # and a file outside the rank folders is no output.
    assert first["total_bytes"] == 9 + 5 + 16 + 3 + 4
    assert first["usage"] == {
        "user": "alice",
        "used_bytes": first["total_bytes"],
        "model_bytes": 0,
        "quota_bytes": QUOTA,
    }
    model = api.get(f"/v1/jobs/{job_id}/outputs/model.pt", headers=me)
    assert model.status_code == 200 and model.content == b"rank zero"
    assert model.headers["content-type"] == "application/octet-stream"
    assert model.headers["content-disposition"].startswith('attachment; filename="model.pt"')
    assert model.headers["x-gangway-rank"] == "0"
    theirs = api.get(f"/v1/jobs/{job_id}/outputs/model.pt", params={"rank": 1}, headers=me)
    assert theirs.content == b"rank one's model" and theirs.headers["x-gangway-rank"] == "1"
    nested = api.get(f"/v1/jobs/{job_id}/outputs/metrics/loss.csv", headers=me)
    assert nested.content == b"1,2,3"


REFUSED = [
    "link.txt",  # a symlink to a file outside
    "up/secret.txt",  # through a symlinked folder
    "checkpoint.pt" + PARTIAL_SUFFIX,  # a copy in progress
    "metrics",  # a folder
    "missing.txt",
    "%2e%2e/secret-beside-ranks.txt",  # encoded traversal (httpx sends it as is)
    "%2e%2e/%2e%2e/secret.txt",
    "..%2F..%2Fsecret.txt",
    "metrics/%2E%2E/%2E%2E/%2E%2E/secret.txt",
    "%2E/model.pt",
    "%2Fetc%2Fpasswd",  # absolute, encoded
    "/etc/passwd",  # absolute: the route's path starts with a slash
    "a%00b",
    "metrics//loss.csv",
]


def test_nothing_outside_the_listing_is_ever_sent(api: TestClient, alice: tuple[str, int]) -> None:
    secret, job_id = alice
    for path in REFUSED:
        response = api.get(f"/v1/jobs/{job_id}/outputs/{path}", headers=bearer(secret))
        assert response.status_code in (404, 422), (path, response.text)
        assert SECRET not in response.content and b"root:" not in response.content
        assert response.json()["error"]["field"] == "path", path


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.lists(
        st.sampled_from(["..", ".", "", "%2e%2e", "%2F", "metrics", "model.pt", "link.txt", "up"])
        | st.text(min_size=1, max_size=12),
        min_size=1,
        max_size=6,
    ).map("/".join),
    rank=st.none() | st.integers(min_value=0, max_value=3),
)
def test_any_path_is_a_listed_file_or_a_4xx(
    api: TestClient, alice: tuple[str, int], path: str, rank: int | None
) -> None:
    """Whatever is asked, the answer is a file the listing shows or a 404/422 naming the
    path: never a 5xx, never bytes from outside the job's rank folders."""
    secret, job_id = alice
    params = {"rank": rank} if rank is not None else {}
    response = api.get(
        f"/v1/jobs/{job_id}/outputs/{quote(path, safe='/%')}",
        params=params,
        headers=bearer(secret),
    )
    assert response.status_code in (200, 404, 422), (path, response.text)
    assert SECRET not in response.content
    prefix = f"/v1/jobs/{job_id}/outputs/"
    if not response.request.url.path.startswith(prefix):
        return  # httpx dropped dot segments ("a/../b" -> "b"): another route answered
    if response.status_code != 200:
        assert response.json()["error"]["field"] == "path", (path, response.text)
        return
    assert response.headers["content-type"] == "application/octet-stream"
    sent = unquote(response.request.url.path.removeprefix(prefix))
    listing = all_files(api, job_id, bearer(secret), **params)
    listed = [(f["path"], f["rank"]) for f in listing]
    assert (sent, int(response.headers["x-gangway-rank"])) in listed, (path, listed)


def test_a_name_with_a_newline_is_served_and_a_trailing_newline_is_no_other_file(
    api: TestClient, outputs_root: Path, alice: tuple[str, int]
) -> None:
    secret, job_id = alice
    put(outputs_root, job_id, 0, "two\nlines.txt", b"odd name")
    me = bearer(secret)
    assert "two\nlines.txt" in [f["path"] for f in all_files(api, job_id, me)]
    odd = api.get(f"/v1/jobs/{job_id}/outputs/two%0Alines.txt", headers=me)
    assert odd.status_code == 200 and odd.content == b"odd name"
    assert 'filename="two_lines.txt"' in odd.headers["content-disposition"]
    assert api.get(f"/v1/jobs/{job_id}/outputs/model.pt%0A", headers=me).status_code == 404


def test_bad_parameters_are_a_422_naming_them(api: TestClient, alice: tuple[str, int]) -> None:
    secret, job_id = alice
    me = bearer(secret)
    for params, field in (
        ({"cursor": "../x"}, "cursor"),
        ({"cursor": "/abs"}, "cursor"),
        ({"rank": -1}, "rank"),
        ({"limit": 0}, "limit"),
    ):
        response = api.get(f"/v1/jobs/{job_id}/outputs", params=params, headers=me)
        assert response.status_code == 422 and response.json()["error"]["field"] == field
    missing = api.get("/v1/jobs/99999/outputs", headers=me)
    assert missing.status_code == 404
    assert api.get("/v1/jobs/99999/outputs/model.pt", headers=me).status_code == 404


def test_only_the_owner_and_admins_may_list_or_download(
    api: TestClient, alice: tuple[str, int]
) -> None:
    secret, job_id = alice
    bob = bearer(new_user(api, "bob"))
    ops = bearer(new_user(api, "ops", role="admin"))
    for path in ("", "/model.pt"):
        refused = api.get(f"/v1/jobs/{job_id}/outputs{path}", headers=bob)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["field"] == "job_id"
        assert b"rank zero" not in refused.content
        for allowed in (bearer(secret), ops, ADMIN):
            assert api.get(f"/v1/jobs/{job_id}/outputs{path}", headers=allowed).status_code == 200
        assert api.get(f"/v1/jobs/{job_id}/outputs{path}").status_code == 401
    assert api.get(f"/v1/jobs/{job_id}", headers=bob).status_code == 200  # the job stays public


def test_the_owners_usage_counts_the_bytes_of_all_their_jobs(
    api: TestClient, repo: JobRepository, outputs_root: Path, alice: tuple[str, int]
) -> None:
    secret, first = alice
    second = submitted(api, secret)
    put(outputs_root, second, 0, "big.bin", b"x" * 4000)
    bob_job = submitted(api, new_user(api, "bob"))
    put(outputs_root, bob_job, 0, "bob.bin", b"x" * 123)
    listed = api.get(f"/v1/jobs/{second}/outputs", headers=bearer(secret)).json()
    first_bytes = api.get(f"/v1/jobs/{first}/outputs", headers=ADMIN).json()["total_bytes"]
    assert listed["total_bytes"] == 4000
    assert listed["usage"]["used_bytes"] == first_bytes + 4000
    assert listed["usage"]["model_bytes"] == 0
    models = ModelRegistry(repo.engine)
    outputs = LocalOutputs(outputs_root)
    left = storage_usage(repo, models, outputs, "alice", quota_bytes=QUOTA, now=repo.now())
    assert left.remaining_bytes == QUOTA - first_bytes - 4000
    bob = storage_usage(repo, models, outputs, "bob", quota_bytes=100, now=repo.now())
    assert bob.remaining_bytes == 0


def sdk(app: FastAPI, secret: str) -> Client:
    client = Client("http://testserver", api_key=secret)
    client._http = TestClient(app, headers=bearer(secret))
    return client


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_the_sdk_lists_every_page_and_downloads_exactly_the_merged_view(
    app: FastAPI, api: TestClient, alice: tuple[str, int], outputs_root: Path, tmp_path: Path
) -> None:
    secret, job_id = alice
    for i in range(30):  # many pages at this app's 1000-byte page budget
        put(outputs_root, job_id, 0, f"many/f{i:02d}", b"m")
    with sdk(app, secret) as client:
        job = client.get(job_id)
        listed = job.outputs()
        assert len(listed) == 33 and [f.path for f in listed] == sorted(f.path for f in listed)
        written = job.download(to=tmp_path / "all")
        assert sorted(written) == sorted((tmp_path / "all" / f.path).resolve() for f in listed)
        got = tree(tmp_path / "all")
        assert {k: v for k, v in got.items() if not k.startswith("many/")} == MERGED
        assert [p.name for p in (tmp_path / "all").rglob("*.part")] == []
        one = job.download("model.pt", to=tmp_path / "one", rank=1)
        assert [p.read_bytes() for p in one] == [b"rank one's model"]
        assert [f.rank for f in job.outputs(rank=1)] == [1, 1]
        with pytest.raises(ValidationFailed) as outside:
            job.download("../escape.txt", to=tmp_path / "one")
        assert outside.value.field == "path"
        with pytest.raises(NotFound):
            job.download("link.txt", to=tmp_path / "one")
        assert not (tmp_path / "one" / "link.txt").exists()
        assert not (tmp_path / "escape.txt").exists()
    with sdk(app, new_user(api, "bob")) as bob, pytest.raises(Forbidden):
        bob.download(job_id, to=tmp_path / "bob")
    assert not (tmp_path / "bob").exists()


def test_a_download_never_writes_through_a_symlink_out_of_its_folder(
    app: FastAPI, alice: tuple[str, int], tmp_path: Path
) -> None:
    secret, job_id = alice
    target = tmp_path / "dest"
    target.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "metrics").symlink_to(elsewhere)
    with sdk(app, secret) as client, pytest.raises(ValidationFailed):
        client.download(job_id, to=target)
    assert list(elsewhere.iterdir()) == [] and not (target / "model.pt").exists()


def test_the_async_client_lists_and_downloads_alike(
    app: FastAPI, alice: tuple[str, int], tmp_path: Path
) -> None:
    secret, job_id = alice

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://testserver", api_key=secret, transport=transport) as client:
            job = await client.get(job_id)
            assert [f.path for f in await job.outputs()] == sorted(MERGED)
            written = await job.download(to=tmp_path / "async")
            assert len(written) == 3
            assert (await job.download("model.pt", to=tmp_path / "r1", rank=1))[0].read_bytes() == (
                b"rank one's model"
            )
            with pytest.raises(NotFound):
                await job.download("missing", to=tmp_path / "r1")

    asyncio.run(scenario())
    assert tree(tmp_path / "async") == MERGED


@pytest.fixture
def cli(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    def in_process(url: str) -> Client:
        return sdk(app, os.environ["GANGWAY_API_KEY"])

    monkeypatch.setattr(gangway.cli_shared, "connect", in_process)
    return CliRunner()


def test_the_cli_lists_and_downloads(
    cli: CliRunner,
    api: TestClient,
    alice: tuple[str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret, job_id = alice
    monkeypatch.setenv("GANGWAY_API_KEY", secret)
    table = cli.invoke(gangway.cli.app, ["outputs", str(job_id)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["PATH", "BYTES", "RANK", "MODIFIED"]
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["metrics/loss.csv", "5", "0"],
        ["model.pt", "9", "0"],
        ["only-rank-1.txt", "3", "1"],
    ]
    assert lines[4].startswith("3 files, 17 bytes;") and "alice uses" in lines[4]
    as_json = cli.invoke(gangway.cli.app, ["outputs", str(job_id), "--rank", "1", "--json"])
    assert [f["path"] for f in json.loads(as_json.output)] == ["model.pt", "only-rank-1.txt"]
    fetched = cli.invoke(gangway.cli.app, ["download", str(job_id), "--to", str(tmp_path / "d")])
    assert fetched.exit_code == 0, fetched.output
    assert fetched.output.splitlines()[-1] == f"3 files, 17 bytes under {tmp_path / 'd'}"
    assert tree(tmp_path / "d") == MERGED
    one = cli.invoke(
        gangway.cli.app,
        ["download", str(job_id), "model.pt", "--rank", "1", "--to", str(tmp_path / "o")],
    )
    assert one.exit_code == 0 and "16 bytes" in one.output
    monkeypatch.setenv("GANGWAY_API_KEY", new_user(api, "bob"))
    refused = cli.invoke(gangway.cli.app, ["download", str(job_id), "--to", str(tmp_path / "b")])
    assert refused.exit_code == 1 and "403 forbidden" in refused.output


def test_retention_deletes_ended_jobs_outputs_and_checkpoints_and_keeps_the_rest(
    repo: JobRepository, tmp_path: Path
) -> None:
    """Through the real store: `ended_between` finds only jobs that ended (never an active
    one), and the sweep removes their folders once they are older than the age."""
    settings = Settings(data_dir=tmp_path, artifact_retention_days=30)
    now = repo.now()
    old, recent, active = (repo.create(_new_job(name)).id for name in ("old", "recent", "active"))
    repo.with_clock(lambda: now - timedelta(days=31)).transition(
        old, JobState.CANCELLED, reason="test"
    )
    repo.with_clock(lambda: now - timedelta(days=29)).transition(
        recent, JobState.CANCELLED, reason="test"
    )
    made = {}
    for job_id in (old, recent, active):
        put(settings.outputs_root(), job_id, 0, "model.pt", b"m")
        saved = checkpoint_path(job_directory(settings.checkpoint_root(), job_id), 10)
        saved.mkdir(parents=True)
        made[job_id] = (job_outputs_dir(settings.outputs_root(), job_id), saved.parent)
    assert repo.ended_between(None, now) == [old, recent]
    assert repo.ended_between(now - timedelta(days=30), now) == [recent]
    sweeper = ArtifactSweeper(repo, settings.artifact_retention(), lambda: now)
    assert sorted(sweeper.sweep().removed) == sorted(made[old])
    assert all(p.exists() for job_id in (recent, active) for p in made[job_id])
    later = ArtifactSweeper(repo, settings.artifact_retention(), lambda: now + timedelta(days=90))
    assert sorted(later.sweep().removed) == sorted(made[recent])
    assert all(p.exists() for p in made[active])


def _new_job(name: str) -> NewJob:
    spec = JobSubmit.model_validate({**JOB, "parallelism": {"dp": 1}}).model_dump(mode="json")
    return NewJob(
        name=name, queue="default", user="alice", priority=0, spec=spec, num_gpus=1,
        total_steps=5,
    )  # fmt: skip


def test_serve_hands_the_outputs_settings_to_the_app_and_the_sweep(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, storage_quota_bytes=1234, artifact_retention_days=2, auth=False
    )
    app = build_app(settings)
    assert app.state.outputs.root == tmp_path / "outputs" == settings.outputs_root()
    assert app.state.storage_quota_bytes == 1234
    retention = settings.artifact_retention()
    assert retention.age == timedelta(days=2)
    assert [folder(3) for folder in retention.folders] == [
        tmp_path / "outputs" / "job-3",
        job_directory(settings.checkpoint_root(), 3),
    ]
    assert isinstance(retention, ArtifactRetention)
    assert Settings().storage_quota_bytes == 100 * 2**30
    assert Settings().artifact_retention_days == 30


def test_a_renamed_quota_setting_stops_the_service_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANGWAY_OUTPUTS_QUOTA_BYTES", "1000")
    with pytest.raises(
        pydantic.ValidationError, match="GANGWAY_OUTPUTS_QUOTA_BYTES is gone: set GANGWAY_STORAGE"
    ):
        Settings()


def test_outputs_in_a_store_are_listed_served_and_counted_as_in_a_folder(
    repo: JobRepository, tmp_path: Path
) -> None:
    """With GANGWAY_STORAGE_URL the supervisors upload (here by hand, as they do) and the
    API lists, pages, serves and counts through the store; only the owner may read them;
    a store that cannot be read is a 503 the client may retry, never a 500."""
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    store = RemoteOutputs(f"memory://api-outputs-{tmp_path.name}/out")
    app = create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        outputs_root=tmp_path / "unused",
        outputs_store=store,
        storage_quota_bytes=QUOTA,
        limits=Limits(max_page_bytes=1000),
    )
    with TestClient(app, raise_server_exceptions=False) as api:
        secret, bob = new_user(api, "alice"), new_user(api, "bob")
        job_id = submitted(api, secret)
        for rank, files in (
            (0, {"model.pt": b"rank zero", "metrics/loss.csv": b"1,2,3"}),
            (1, {"model.pt": b"rank one's model", "only-rank-1.txt": b"one"}),
        ):
            store.fs.pipe({f"{store.job_url(job_id)}/rank-{rank}/{p}": d for p, d in files.items()})
        listed = all_files(api, job_id, bearer(secret), limit=2)
        assert [(f["path"], f["rank"]) for f in listed] == [
            ("metrics/loss.csv", 0),
            ("model.pt", 0),
            ("only-rank-1.txt", 1),
        ]
        first = api.get(f"/v1/jobs/{job_id}/outputs", headers=bearer(secret)).json()
        assert first["total_bytes"] == first["usage"]["used_bytes"] == 9 + 5 + 16 + 3
        got = api.get(f"/v1/jobs/{job_id}/outputs/model.pt", headers=bearer(secret))
        assert (got.status_code, got.content) == (200, b"rank zero")
        assert got.headers["x-gangway-rank"] == "0" and got.headers["content-length"] == "9"
        one = api.get(f"/v1/jobs/{job_id}/outputs/model.pt?rank=1", headers=bearer(secret))
        assert one.content == b"rank one's model"
        missing = api.get(f"/v1/jobs/{job_id}/outputs/metrics", headers=bearer(secret))
        assert missing.status_code == 404 and missing.json()["error"]["field"] == "path"
        refused = api.get(f"/v1/jobs/{job_id}/outputs/model.pt", headers=bearer(bob))
        assert refused.status_code == 403 and b"rank zero" not in refused.content

        def unreachable(*args: object, **kwargs: object) -> Any:
            raise ConnectionError("could not connect to the endpoint URL")

        store.fs.find = unreachable  # type: ignore[method-assign]
        store.fs.info = unreachable  # type: ignore[method-assign]
        store._usage.forget(job_id)
        try:
            for path in ("", "/model.pt"):
                down = api.get(f"/v1/jobs/{job_id}/outputs{path}", headers=bearer(secret))
                assert down.status_code == 503, down.text
                assert down.json()["error"]["code"] == "storage_unavailable"
        finally:
            del store.fs.find, store.fs.info


def test_one_storage_url_names_where_checkpoints_and_outputs_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"memory://settings-{tmp_path.name}/gangway/"
    settings = Settings(data_dir=tmp_path, storage_url=url, auth=False)
    policy = settings.launch_policy()
    root = url.rstrip("/")
    assert (policy.checkpoint_url, policy.outputs_url) == (f"{root}/checkpoints", f"{root}/outputs")
    app = build_app(settings)
    assert isinstance(app.state.outputs, RemoteOutputs)
    assert app.state.outputs.url == f"{root}/outputs"
    assert app.state.checkpoint_store.url == f"{root}/checkpoints"
    assert app.state.model_store.url == policy.models_url == f"{root}/models"
    swept = [store(3).url for store in settings.artifact_retention().stores]
    assert swept == [f"{root}/checkpoints/job-3", f"{root}/outputs/job-3"]
    monkeypatch.setenv("GANGWAY_CHECKPOINT_URL", "s3://old/setting")
    with pytest.raises(pydantic.ValidationError, match="GANGWAY_STORAGE_URL"):
        Settings(data_dir=tmp_path)
