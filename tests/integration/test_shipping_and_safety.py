"""Shipping working directories, admin submit policy, browser safety with auth off and
per-user hygiene, through the real app and database (no Ray)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.auth import AuthConfig
from api.policy import SubmitPolicy, policy_from_settings
from api.server import UnsafeBind, check_bind
from api.settings import Settings
from gangway import Client
from gangway.errors import ValidationFailed
from gangway.packaging import pack
from scheduler.model import Node
from scheduler.store import JobRepository
from scheduler.store.packages import PackageStore
from tests.integration.test_auth import ADMIN_KEY, bearer, new_user

BUILTIN = {"name": "j", "entrypoint": {"kind": "builtin", "steps": 5}}


def _app(repo: JobRepository, tmp_path: Path, **options: Any) -> TestClient:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    app = create_app(repo, packages_root=tmp_path / "packages", **options)
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def open_api(repo: JobRepository, tmp_path: Path) -> Iterator[TestClient]:
    """Auth off, as the embedded default."""
    with _app(repo, tmp_path) as client:
        yield client


@pytest.fixture
def auth_api(repo: JobRepository, tmp_path: Path) -> Iterator[TestClient]:
    """Auth on with the default policy that comes with it."""
    policy = policy_from_settings(
        auth_required=True, kinds={}, script_roots=None, function_modules=None
    )
    auth = AuthConfig(required=True, admin_key=ADMIN_KEY)
    with _app(repo, tmp_path, auth=auth, submit_policy=policy) as client:
        yield client


def _workdir(root: Path) -> Path:
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("VALUE = 42\n")
    (root / "train.py").write_text("import mypkg\nprint(open('data.txt').read(), mypkg.VALUE)\n")
    (root / "data.txt").write_text("hello")
    (root / "big.bin").write_bytes(b"x" * 1000)
    (root / "notes.log").write_text("ignored by .gangwayignore")
    (root / ".gitignore").write_text("*.bin\n")
    (root / ".gangwayignore").write_text("*.log\n")
    return root


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


# -- packing --------------------------------------------------------------------------


def test_a_package_is_deterministic_and_honours_the_ignore_files(tmp_path: Path) -> None:
    root = _workdir(tmp_path / "w")
    first = pack(root)
    (root / "data.txt").touch()  # a new mtime changes nothing
    assert pack(root).sha256 == first.sha256
    import io
    import zipfile

    names = zipfile.ZipFile(io.BytesIO(first.data)).namelist()
    assert names == sorted(names)
    assert "workdir/train.py" in names and "workdir/mypkg/__init__.py" in names
    assert not any(n.endswith((".bin", ".log")) for n in names)
    (root / "data.txt").write_text("changed")
    assert pack(root).sha256 != first.sha256


def test_a_package_over_the_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    (root / "weights.pt").write_bytes(bytes(range(256)) * 400)
    with pytest.raises(ValueError, match=r"limit of 1000 bytes.*weights\.pt"):
        pack(root, max_bytes=1000)


# -- upload ---------------------------------------------------------------------------


def test_upload_is_content_addressed_verified_and_capped(
    repo: JobRepository, tmp_path: Path
) -> None:
    data = _zip({})  # an empty zip: 22 bytes
    sha = hashlib.sha256(data).hexdigest()
    with _app(repo, tmp_path, package_max_bytes=64) as api:
        assert api.get(f"/v1/packages/{sha}").status_code == 404
        assert api.head(f"/v1/packages/{sha}").status_code == 404
        wrong = api.put(f"/v1/packages/{'0' * 64}", content=data)
        assert (wrong.status_code, wrong.json()["error"]["field"]) == (422, "sha256")
        assert api.put(f"/v1/packages/{sha}", content=data).status_code == 201
        again = api.put(f"/v1/packages/{sha}", content=data)
        assert again.status_code == 200 and again.json()["size_bytes"] == len(data)
        assert api.head(f"/v1/packages/{sha}").status_code == 200
        big = b"y" * 65
        too_big = api.put(f"/v1/packages/{hashlib.sha256(big).hexdigest()}", content=big)
        assert too_big.status_code == 413
        assert "64 bytes" in too_big.json()["error"]["message"]
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == [f"{sha}.zip"]


def test_a_second_submit_of_an_unchanged_directory_uploads_nothing(
    open_api: TestClient, tmp_path: Path
) -> None:
    root = _workdir(tmp_path / "w")
    sent: list[int] = []

    def forward(request: httpx.Request) -> httpx.Response:
        body = request.read()
        sent.append(len(body) if request.method == "PUT" else 0)
        answer = open_api.request(
            request.method, request.url.path, content=body, headers=dict(request.headers)
        )
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    client = Client("http://testserver", transport=httpx.MockTransport(forward))
    command = {"kind": "command", "argv": ["python", "train.py"]}
    first = client.submit(name="a", entrypoint=command, working_dir=root, env={"A": "1"})
    uploaded = sum(sent)
    second = client.submit(name="b", entrypoint=command, working_dir=root)
    assert uploaded == len(pack(root).data) > 0
    assert sum(sent) == uploaded  # the second submit sent no package bytes
    assert first.spec.package == second.spec.package == pack(root).sha256
    assert first.spec.env == {"A": "1"}


def test_cli_submit_workdir_says_what_it_uploaded(
    open_api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gangway import cli, cli_shared

    root = _workdir(tmp_path / "w")
    (tmp_path / "req.txt").write_text("# none needed\nsix\n")

    def connect(url: str) -> Client:
        client = Client(url)
        client._http = TestClient(open_api.app)  # the app, no server
        return client

    monkeypatch.setattr(cli_shared, "connect", connect)
    argv = ["submit", "--workdir", str(root), "--requirements", str(tmp_path / "req.txt")]
    argv += ["--env", "LR=3e-4", "--json", "--", "python", "train.py", "--lr", "3e-4"]
    runner = CliRunner()
    first = runner.invoke(cli.app, argv)
    assert first.exit_code == 0, first.output
    assert "bytes uploaded" in first.stderr
    second = runner.invoke(cli.app, argv)
    assert "nothing uploaded" in second.stderr
    job = open_api.get("/v1/jobs/2").json()["spec"]
    assert job["entrypoint"] == {"kind": "command", "argv": ["python", "train.py", "--lr", "3e-4"]}
    assert (job["requirements"], job["env"]) == (["six"], {"LR": "3e-4"})


def test_a_job_naming_a_package_never_uploaded_is_refused(open_api: TestClient) -> None:
    body = {**BUILTIN, "package": "a" * 64}
    answer = open_api.post("/v1/jobs", json=body)
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "package"
    assert "was not uploaded" in answer.json()["error"]["message"]


def test_env_names_are_checked(open_api: TestClient) -> None:
    answer = open_api.post("/v1/jobs", json={**BUILTIN, "env": {"1BAD": "x"}})
    assert answer.status_code == 422 and answer.json()["error"]["field"].startswith("env")


def test_unused_packages_are_collected_after_the_grace_period(
    repo: JobRepository, tmp_path: Path
) -> None:
    import asyncio
    from datetime import UTC, datetime, timedelta

    store = PackageStore(repo.engine, tmp_path / "p")

    async def upload(data: bytes) -> str:
        async def chunks() -> Any:
            yield data

        sha = hashlib.sha256(data).hexdigest()
        await store.put(sha, chunks(), owner="u", max_bytes=1000)
        return sha

    kept = asyncio.run(upload(_zip({"workdir/kept": b"1"})))
    dropped = asyncio.run(upload(_zip({"workdir/dropped": b"2"})))
    with _app(repo, tmp_path) as api:
        api.app.state.packages = store  # type: ignore[attr-defined]
        command = {"kind": "command", "argv": ["true"]}
        assert api.post("/v1/jobs", json={**BUILTIN, "package": kept, "entrypoint": command})
    later = datetime.now(UTC) + timedelta(hours=2)
    assert store.collect(grace_s=3600, now=later) == [dropped]
    assert store.get(kept) is not None and not store.path(dropped).exists()


# -- admin policy ---------------------------------------------------------------------


def test_submit_never_imports_the_function_module(
    open_api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "evilpkg").mkdir()
    (tmp_path / "evilpkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    (tmp_path / "evilpkg" / "mod.py").write_text(f"open({str(marker)!r}, 'w')\ndef fn(ctx): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ok = open_api.post(
        "/v1/jobs", json={**BUILTIN, "entrypoint": {"kind": "function", "target": "evilpkg.mod:fn"}}
    )
    missing = open_api.post(
        "/v1/jobs",
        json={**BUILTIN, "entrypoint": {"kind": "function", "target": "evilpkg.mod:nope"}},
    )
    assert ok.status_code == 201, ok.text
    assert (missing.status_code, missing.json()["error"]["field"]) == (422, "entrypoint.target")
    assert not marker.exists()


def test_with_auth_on_only_shipped_code_and_the_examples_run_by_default(
    auth_api: TestClient,
) -> None:
    alice = new_user(auth_api, "alice")
    script = {"kind": "script", "path": "/usr/lib/python3.11/timeit.py", "args": ["-n1", "1"]}
    refused = auth_api.post("/v1/jobs", json={**BUILTIN, "entrypoint": script}, headers=alice)
    assert (refused.status_code, refused.json()["error"]["field"]) == (403, "entrypoint.path")
    function = {"kind": "function", "target": "subprocess:run"}
    refused = auth_api.post("/v1/jobs", json={**BUILTIN, "entrypoint": function}, headers=alice)
    assert (refused.status_code, refused.json()["error"]["field"]) == (403, "entrypoint.target")
    command = {"kind": "command", "argv": ["sh", "-c", "env"]}
    refused = auth_api.post("/v1/jobs", json={**BUILTIN, "entrypoint": command}, headers=alice)
    assert (refused.status_code, refused.json()["error"]["field"]) == (403, "package")
    example = {"kind": "function", "target": "workers.examples:check_mesh"}
    allowed = auth_api.post("/v1/jobs", json={**BUILTIN, "entrypoint": example}, headers=alice)
    assert allowed.status_code == 201, allowed.text


def test_admins_restrict_entrypoint_kinds_per_role(repo: JobRepository, tmp_path: Path) -> None:
    policy = SubmitPolicy(
        kinds={"user": frozenset({"builtin"}), "admin": frozenset({"builtin", "function"})}
    )
    auth = AuthConfig(required=True, admin_key=ADMIN_KEY)
    with _app(repo, tmp_path, auth=auth, submit_policy=policy) as api:
        bob = new_user(api, "bob")
        function = {
            **BUILTIN,
            "entrypoint": {"kind": "function", "target": "workers.examples:check_mesh"},
        }
        refused = api.post("/v1/jobs", json=function, headers=bob)
        assert (refused.status_code, refused.json()["error"]["field"]) == (403, "entrypoint.kind")
        assert "allowed: builtin" in refused.json()["error"]["message"]
        assert api.post("/v1/jobs", json=BUILTIN, headers=bob).status_code == 201
        assert api.post("/v1/jobs", json=function, headers=bearer(ADMIN_KEY)).status_code == 201


def test_a_shipped_script_path_stays_inside_the_working_directory(
    open_api: TestClient, tmp_path: Path
) -> None:
    data = pack(_workdir(tmp_path / "w"))
    open_api.put(f"/v1/packages/{data.sha256}", content=data.data)
    for path in ("/etc/passwd", "../outside.py"):
        body = {**BUILTIN, "package": data.sha256, "entrypoint": {"kind": "script", "path": path}}
        answer = open_api.post("/v1/jobs", json=body)
        assert (answer.status_code, answer.json()["error"]["field"]) == (403, "entrypoint.path")
    body = {**BUILTIN, "package": data.sha256, "entrypoint": {"kind": "script", "path": "train.py"}}
    created = open_api.post("/v1/jobs", json=body)
    assert created.json()["spec"]["entrypoint"]["path"] == "train.py"  # not made absolute


def test_settings_build_the_policy() -> None:
    settings = Settings(
        database_url="postgresql://x/y",
        allowed_entrypoints={"user": ["builtin", "command"]},
        script_roots=["/srv/scripts"],
    )
    policy = policy_from_settings(
        auth_required=settings.auth_required(),
        kinds={str(r): list(k) for r, k in settings.allowed_entrypoints.items()},
        script_roots=settings.script_roots,
        function_modules=settings.function_modules,
    )
    assert policy.kinds["user"] == {"builtin", "command"}
    assert policy.script_roots == (Path("/srv/scripts"),)
    assert policy.function_modules == ("workers.examples",)


# -- browser safety with auth off -----------------------------------------------------


def test_a_cross_site_cancel_is_refused(open_api: TestClient) -> None:
    job = open_api.post("/v1/jobs", json=BUILTIN).json()["id"]
    forged = [
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "null"},
    ]
    for headers in forged:
        answer = open_api.post(f"/v1/jobs/{job}/cancel", headers=headers)
        assert answer.status_code == 403, headers
        assert answer.json()["error"]["field"] == "Origin"
    assert open_api.get(f"/v1/jobs/{job}").json()["state"] == "PENDING"
    # The status page's own requests (same origin) and clients outside a browser still work.
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    assert open_api.post(f"/v1/jobs/{job}/cancel", headers=same).status_code == 200


def test_only_allowed_host_headers_are_served(repo: JobRepository, tmp_path: Path) -> None:
    from api.browser import allowed_hosts

    with _app(repo, tmp_path, allowed_hosts=allowed_hosts("127.0.0.1", ["gw.lan"])) as api:
        assert api.get("/healthz", headers={"Host": "127.0.0.1:8000"}).status_code == 200
        assert api.get("/healthz", headers={"Host": "gw.lan"}).status_code == 200
        rebound = api.get("/v1/jobs", headers={"Host": "attacker.example"})
        assert rebound.status_code == 400


def test_auth_off_refuses_a_non_loopback_bind_unless_forced() -> None:
    with pytest.raises(UnsafeBind, match=r"0\.0\.0\.0 with auth off"):
        check_bind(Settings(host="0.0.0.0"))
    check_bind(Settings(host="127.0.0.1"))
    check_bind(Settings(host="0.0.0.0", allow_remote_without_auth=True))
    check_bind(Settings(host="0.0.0.0", auth=True))


# -- per-user hygiene -----------------------------------------------------------------


def test_idempotency_keys_are_per_user(auth_api: TestClient) -> None:
    alice, bob = new_user(auth_api, "alice"), new_user(auth_api, "bob")
    key = {"Idempotency-Key": "nightly"}
    first = auth_api.post("/v1/jobs", json=BUILTIN, headers={**alice, **key})
    other = auth_api.post("/v1/jobs", json={**BUILTIN, "name": "x"}, headers={**bob, **key})
    assert first.status_code == other.status_code == 201
    assert other.json()["id"] != first.json()["id"]
    replay = auth_api.post("/v1/jobs", json=BUILTIN, headers={**alice, **key})
    assert replay.json()["id"] == first.json()["id"]


def test_a_revoke_refusal_names_no_owner_and_reserved_names_are_refused(
    auth_api: TestClient,
) -> None:
    new_user(auth_api, "alice")
    mallory = new_user(auth_api, "mallory")
    key_id = auth_api.get("/v1/users/alice/keys", headers=bearer(ADMIN_KEY)).json()[0]["id"]
    refused = auth_api.post(f"/v1/keys/{key_id}/revoke", headers=mallory)
    assert refused.status_code == 403 and "alice" not in refused.text
    for name in ("admin", "default", "Admin"):
        answer = auth_api.post("/v1/users", json={"name": name}, headers=bearer(ADMIN_KEY))
        assert (answer.status_code, answer.json()["error"]["field"]) == (422, "name"), name


def test_sdk_checks_env_names_before_sending() -> None:
    client = Client("http://x", transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    with pytest.raises(ValidationFailed):
        client.submit(name="j", entrypoint={"kind": "builtin"}, env={"A=B": "1"})
