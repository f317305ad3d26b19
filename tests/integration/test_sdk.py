"""Both SDK clients against the real app and database, with auth on: `Client` through
Starlette's TestClient (an httpx.Client), `AsyncClient` through httpx.ASGITransport."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import AuthConfig
from gangway import (
    AsyncClient,
    AsyncJob,
    Builtin,
    Client,
    Forbidden,
    Job,
    JobState,
    NotFound,
    Parallelism,
    Unauthorized,
    ValidationFailed,
)
from scheduler.model import Node
from scheduler.store import JobRepository

ADMIN_KEY = "sdk-tests-bootstrap-key"


@pytest.fixture
def app(repo: JobRepository) -> FastAPI:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0), Node("n2", "local-2", 4, 8.0)])
    return create_app(repo, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))


def sync_client(app: FastAPI, api_key: str) -> Client:
    client = Client("http://testserver", api_key=api_key)
    client._http = TestClient(app, headers={"Authorization": f"Bearer {api_key}"})
    return client


def async_client(app: FastAPI, api_key: str) -> AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return AsyncClient("http://testserver", api_key=api_key, transport=transport)


@pytest.fixture
def admin(app: FastAPI) -> Iterator[Client]:
    with sync_client(app, ADMIN_KEY) as client:
        yield client


def test_an_admin_manages_users_keys_and_queues_from_the_sdk(admin: Client, app: FastAPI) -> None:
    assert admin.whoami().role == "admin"
    assert admin.create_user("alice").role == "user"
    assert [u.name for u in admin.users()] == ["alice"]
    issued = admin.issue_key("alice")
    alice = sync_client(app, issued.secret)
    assert alice.whoami().name == "alice"
    assert [k.id for k in alice.keys("alice")] == [issued.id]
    with pytest.raises(Forbidden):
        alice.set_queue("research", guaranteed_gpus=4)
    research = admin.set_queue("research", guaranteed_gpus=4, borrow_limit_gpus=2)
    assert (research.guaranteed_gpus, research.borrow_limit_gpus) == (4, 2)
    assert [q.name for q in alice.queues()] == ["research"]
    admin.delete_queue("research")
    with pytest.raises(NotFound):
        admin.delete_queue("research")
    with pytest.raises(ValidationFailed) as bad:
        admin.set_queue("research", guaranteed_gpus=-1)  # refused before any request
    assert bad.value.field == "guaranteed_gpus"
    assert admin.revoke_key(issued.id).revoked_at is not None
    with pytest.raises(Unauthorized):
        alice.whoami()


def test_the_async_client_does_what_the_blocking_one_does(admin: Client, app: FastAPI) -> None:
    admin.create_user("bob")
    secret = admin.issue_key("bob").secret

    async def scenario() -> None:
        async with async_client(app, secret) as bob:
            job = await bob.submit(
                name="a", parallelism=Parallelism(dp=2), entrypoint=Builtin(steps=5)
            )
            assert isinstance(job, AsyncJob) and job.user == "bob"
            assert (await job.set_priority(4)).priority == 4
            assert (await job.explain()).state is JobState.PENDING
            page = await bob.list(user="bob", state="PENDING")
            assert [j.id for j in page.items] == [job.id]
            assert (await bob.cluster()).gpus_total == 8
            assert await job.metrics() == [] and await job.logs() == []
            assert (await job.checkpoints()).checkpoints == []
            assert (await job.cancel()).state is JobState.CANCELLED
            assert [e.to_state for e in await job.events()][-1] is JobState.CANCELLED
            assert [line async for line in job.follow_logs()] == []  # ended: end event
            with pytest.raises(Forbidden):
                await bob.users()
        async with async_client(app, "gw_wrong") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.get(job.id)

    asyncio.run(scenario())


def test_a_user_cannot_change_someone_elses_job(admin: Client, app: FastAPI) -> None:
    job = admin.submit(name="admins", entrypoint=Builtin(steps=5))
    assert isinstance(job, Job) and job.user == "admin"
    admin.create_user("carol")
    carol = sync_client(app, admin.issue_key("carol").secret)
    assert carol.get(job.id).id == job.id  # everyone may look
    with pytest.raises(Forbidden) as refused:
        carol.cancel(job.id)
    assert refused.value.status_code == 403 and refused.value.code == "forbidden"
    with pytest.raises(Forbidden) as as_admin:
        carol.submit(name="x", user="admin", entrypoint=Builtin(steps=5))
    assert as_admin.value.field == "user"


def test_logs_page_on_after_the_last_line_seen(admin: Client, repo: JobRepository) -> None:
    job = admin.submit(name="chatty", entrypoint=Builtin(steps=5))
    repo.append_logs(job.id, 1, [(0, 1, "first"), (0, 2, "second"), (1, 1, "third")])
    newest = admin.logs(job.id, tail=1)
    assert [line.line for line in newest] == ["third"]
    first = admin.logs(job.id, tail=1, after=0)
    assert [line.line for line in first] == ["first"]
    rest = admin.logs(job.id, after=first[0].id)
    assert [line.line for line in rest] == ["second", "third"]
    assert admin.logs(job.id, after=rest[-1].id) == []
