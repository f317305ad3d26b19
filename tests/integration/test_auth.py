"""API keys, users, roles and queue administration through the real app and database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import AuthConfig
from api.settings import Settings
from scheduler.model import Node, QueueQuota
from scheduler.store import AccountRepository, JobRepository, QueueRepository

ADMIN_KEY = "bootstrap-admin-key-for-tests"
JOB = {"name": "j", "parallelism": {"dp": 1}, "entrypoint": {"kind": "builtin", "steps": 5}}


@pytest.fixture
def api(repo: JobRepository) -> Iterator[TestClient]:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    app = create_app(repo, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def new_user(api: TestClient, name: str, role: str = "user") -> dict[str, str]:
    """Create `name` with the bootstrap key and return headers with their own key."""
    created = api.post("/v1/users", json={"name": name, "role": role}, headers=bearer(ADMIN_KEY))
    assert created.status_code == 201, created.text
    issued = api.post(f"/v1/users/{name}/keys", headers=bearer(ADMIN_KEY))
    assert issued.status_code == 201, issued.text
    secret: str = issued.json()["secret"]
    assert secret.startswith("gw_")
    return bearer(secret)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/1/logs/stream"),
        ("GET", "/v1/cluster"),
        ("GET", "/v1/users"),
        ("PUT", "/v1/queues/q"),
        ("GET", "/v1/whoami"),
    ],
)
def test_without_a_valid_key_every_v1_route_is_401(api: TestClient, method: str, path: str) -> None:
    for headers in ({}, bearer("gw_not-a-key"), {"Authorization": "Basic dXNlcjpwdw=="}):
        response = api.request(method, path, headers=headers, json=JOB)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["error"]["field"] == "Authorization"


def test_health_and_prometheus_stay_open(api: TestClient) -> None:
    assert api.get("/healthz").status_code == 200
    assert api.get("/metrics").status_code == 200


def test_a_user_submits_as_themselves_and_changes_only_their_own_jobs(
    api: TestClient,
) -> None:
    alice, bob = new_user(api, "alice"), new_user(api, "bob")
    assert api.get("/v1/whoami", headers=alice).json() == {
        "name": "alice",
        "role": "user",
        "auth_enabled": True,
        "queues": [],
    }
    job = api.post("/v1/jobs", json=JOB, headers=alice).json()
    assert job["user"] == "alice"  # from the key, not the body's default
    as_bob = api.post("/v1/jobs", json={**JOB, "user": "bob"}, headers=alice)
    assert as_bob.status_code == 403 and as_bob.json()["error"]["field"] == "user"
    # bob sees alice's job but may not change it
    assert api.get(f"/v1/jobs/{job['id']}", headers=bob).status_code == 200
    assert len(api.get("/v1/jobs", headers=bob).json()["items"]) == 1
    for method, path, payload in (
        ("POST", f"/v1/jobs/{job['id']}/cancel", None),
        ("PATCH", f"/v1/jobs/{job['id']}", {"priority": 5}),
    ):
        refused = api.request(method, path, json=payload, headers=bob)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"
    assert (
        api.patch(f"/v1/jobs/{job['id']}", json={"priority": 5}, headers=alice).json()["priority"]
        == 5
    )
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=alice).json()["state"] == "CANCELLED"
    timeline = [e["reason"] for e in api.get(f"/v1/jobs/{job['id']}/events", headers=bob).json()]
    assert timeline[-2:] == ["priority changed from 0 to 5 by alice", "cancelled by alice"]


def test_an_admin_changes_anyones_jobs_and_may_submit_for_others(api: TestClient) -> None:
    alice, root = new_user(api, "alice"), new_user(api, "root", role="admin")
    job = api.post("/v1/jobs", json=JOB, headers=alice).json()
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=root).status_code == 200
    for_alice = api.post("/v1/jobs", json={**JOB, "user": "alice"}, headers=root)
    assert for_alice.status_code == 201 and for_alice.json()["user"] == "alice"


def test_users_and_queues_are_admin_business(api: TestClient) -> None:
    alice = new_user(api, "alice")
    attempts: list[tuple[str, str, Any]] = [
        ("GET", "/v1/users", None),
        ("POST", "/v1/users", {"name": "mallory"}),
        ("POST", "/v1/users/bob/keys", None),
        ("PUT", "/v1/queues/research", {"guaranteed_gpus": 4}),
        ("DELETE", "/v1/queues/research", None),
        ("PUT", "/v1/queues/research/members", {"members": ["alice"]}),
        ("POST", "/v1/calibrations", None),
    ]
    for method, path, payload in attempts:
        response = api.request(method, path, json=payload, headers=alice)
        assert response.status_code == 403, (path, response.text)
    assert api.get("/v1/queues", headers=alice).status_code == 200  # anyone lists them


def test_keys_are_shown_once_stored_hashed_and_revocable(
    api: TestClient, repo: JobRepository
) -> None:
    alice = new_user(api, "alice")
    second = api.post("/v1/users/alice/keys", headers=alice)  # a user rotates their own
    assert second.status_code == 201
    listed = api.get("/v1/users/alice/keys", headers=alice).json()
    assert [k["id"] for k in listed] == [1, second.json()["id"]]
    assert all("secret" not in k for k in listed)
    with repo.engine.connect() as conn:
        stored = {row[0] for row in conn.exec_driver_sql("SELECT secret_sha256 FROM api_keys")}
    assert second.json()["secret"] not in stored and len(stored) == 2
    revoked = api.post("/v1/keys/1/revoke", headers=bearer(second.json()["secret"]))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert api.get("/v1/jobs", headers=alice).status_code == 401  # the first key is dead
    assert api.get("/v1/jobs", headers=bearer(second.json()["secret"])).status_code == 200
    bob = new_user(api, "bob")
    assert api.post(f"/v1/keys/{second.json()['id']}/revoke", headers=bob).status_code == 403
    assert api.post("/v1/keys/999/revoke", headers=bob).status_code == 404


def test_user_errors_name_what_is_wrong(api: TestClient) -> None:
    admin = bearer(ADMIN_KEY)
    new_user(api, "alice")
    taken = api.post("/v1/users", json={"name": "alice"}, headers=admin)
    assert taken.status_code == 409
    bad_role = api.post("/v1/users", json={"name": "x", "role": "root"}, headers=admin)
    assert bad_role.status_code == 422 and bad_role.json()["error"]["field"] == "role"
    assert api.post("/v1/users/nobody/keys", headers=admin).status_code == 404
    assert api.get("/v1/users", headers=admin).json()[0]["name"] == "alice"
    for reserved in ("admin", "default", "gangway"):  # gangway: the calibration runs' user
        named = api.post("/v1/users", json={"name": reserved}, headers=admin)
        assert named.status_code == 422 and named.json()["error"]["field"] == "name"


def test_admins_create_change_and_delete_queues(api: TestClient, repo: JobRepository) -> None:
    admin = bearer(ADMIN_KEY)
    created = api.put("/v1/queues/research", json={"guaranteed_gpus": 2}, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["guaranteed_gpus"] == 2 and created.json()["borrow_limit_gpus"] is None
    changed = api.put(
        "/v1/queues/research",
        json={"guaranteed_gpus": 1, "borrow_limit_gpus": 0, "weight": 3},
        headers=admin,
    )
    assert changed.status_code == 200 and changed.json()["borrow_limit_gpus"] == 0
    assert QueueRepository(repo.engine).quotas()["research"] == QueueQuota(1, 0, weight=3.0)
    zero = api.put("/v1/queues/research", json={"weight": 0}, headers=admin)
    assert zero.status_code == 422 and zero.json()["error"]["field"] == "weight"
    bad = api.put("/v1/queues/research", json={"guaranteed_gpus": -1}, headers=admin)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "guaranteed_gpus"
    assert api.put("/v1/queues/bad name", json={}, headers=admin).status_code == 422
    assert api.delete("/v1/queues/research", headers=admin).status_code == 204
    assert api.delete("/v1/queues/research", headers=admin).status_code == 404
    assert QueueRepository(repo.engine).quotas() == {}


def test_with_auth_off_everyone_is_an_admin_and_user_comes_from_the_body(
    repo: JobRepository,
) -> None:
    with TestClient(create_app(repo), raise_server_exceptions=False) as api:
        assert api.get("/v1/whoami").json() == {
            "name": "default",
            "role": "admin",
            "auth_enabled": False,
            "queues": [],
        }
        assert api.post("/v1/jobs", json={**JOB, "user": "carol"}).json()["user"] == "carol"


def test_auth_is_off_by_default_only_for_the_embedded_database() -> None:
    assert Settings().auth_required() is False
    assert Settings(database_url="postgresql://db/x").auth_required() is True
    assert Settings(database_url="postgresql://db/x", auth=False).auth_required() is False
    assert Settings(auth=True).auth_required() is True


def test_the_service_calibrates_on_its_own_only_with_a_ray_cluster_of_its_own() -> None:
    """The embedded Ray's logical GPUs share this host's cores: calibration runs beside a
    user's first jobs would slow them and measure them."""
    assert Settings(auto_calibrate=None).calibrates() is False
    assert Settings(auto_calibrate=None, ray_address="head:6379").calibrates() is True
    assert Settings(auto_calibrate=True).calibrates() is True


def test_revoked_and_unknown_keys_authenticate_no_one(repo: JobRepository) -> None:
    accounts = AccountRepository(repo.engine)
    accounts.create_user("dana", "user")
    key, secret = accounts.issue_key("dana")
    assert accounts.authenticate(secret) is not None
    assert accounts.authenticate(secret + "x") is None
    accounts.revoke_key(key.id)
    assert accounts.authenticate(secret) is None
    assert accounts.keys("dana")[0].revoked_at is not None
