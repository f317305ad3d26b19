"""The model registry as its users, and an attacker, meet it through the public API and
the SDK (auth on): a job's owner registers versions of its checkpoints; a reader lists and
downloads them, each file checked against its SHA-256; a stranger learns nothing of the
model (404, no owner named); a file changed on disk is refused, never served; a link
planted in a checkpoint by the job copies nothing of the service's."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import AuthConfig
from gangway import Client, Conflict, Forbidden, NotFound, ValidationFailed
from scheduler.model import Node
from scheduler.store import JobRepository
from scheduler.store.outputs import job_outputs_dir
from scheduler.store.records import ReportedPoint
from workers.checkpoint_layout import checkpoint_path, job_directory

ADMIN_KEY = "registry-tests-bootstrap-key"
JOB = {"name": "pretrain", "entrypoint": {"kind": "builtin", "steps": 20}, "env": {"K": "v"}}
SHARDS = {".metadata": b"dcp metadata", "__0_0.distcp": b"rank 0 shard", "__1_0.distcp": b"one"}


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "checkpoints", tmp_path / "models"


@pytest.fixture
def app(repo: JobRepository, roots: tuple[Path, Path]) -> FastAPI:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    return create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        checkpoint_root=roots[0],
        models_root=roots[1],
    )


@pytest.fixture
def clients(app: FastAPI) -> Iterator[dict[str, Client]]:
    admin = as_user(app, ADMIN_KEY)
    made = {"admin": admin}
    for name in ("alice", "bob", "mallory"):
        admin.create_user(name)
        made[name] = as_user(app, admin.issue_key(name).secret)
    yield made


def as_user(app: FastAPI, secret: str) -> Client:
    client = Client("http://testserver", api_key=secret)
    client._http = TestClient(app, headers={"Authorization": f"Bearer {secret}"})
    return client


def checkpoint(root: Path, job_id: int, step: int, files: dict[str, bytes]) -> Path:
    folder = checkpoint_path(job_directory(root, job_id), step)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def alices_job(alice: Client, repo: JobRepository, root: Path) -> int:
    job_id = alice.submit(**JOB).id
    checkpoint(root, job_id, 10, SHARDS)
    checkpoint(root, job_id, 20, {**SHARDS, "__0_0.distcp": b"newer shard"})
    repo.append_points(job_id, 1, [ReportedPoint(1, 10, 0.0, {"val_loss": 2.5})], None)
    return job_id


def test_owner_registers_readers_download_strangers_see_nothing(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    alice, bob, mallory = clients["alice"], clients["bob"], clients["mallory"]
    job_id = alices_job(alice, repo, roots[0])

    first = alice.register_model("gpt", job_id, step=10, readers=["bob"])
    assert (first.version, first.job_id, first.step, first.created_by) == (1, job_id, 10, "alice")
    assert first.metrics == {"val_loss": 2.5}
    assert first.spec["env"] == {"K": "***"}  # the job's env values are not the readers'
    assert {f.path: f.sha256 for f in first.files} == {
        name: hashlib.sha256(data).hexdigest() for name, data in SHARDS.items()
    }
    second = alice.register_model("gpt", job_id)  # the newest checkpoint
    assert (second.version, second.step) == (2, 20)
    alice.set_alias("gpt", "production", 1)

    # a reader lists, reads and downloads, by alias too, each file verified
    assert [m.name for m in bob.models()] == ["gpt"]
    shown = bob.model("gpt")
    assert (shown.owner, shown.aliases, [v.version for v in shown.versions]) == (
        "alice",
        {"production": 1},
        [1, 2],
    )
    written = bob.download_model("gpt", "production", tmp_path / "got")
    assert {p.name: p.read_bytes() for p in written} == SHARDS
    # ... but moves no alias, and adds no version
    with pytest.raises(Forbidden):
        bob.set_alias("gpt", "production", 2)
    with pytest.raises(Forbidden):
        bob.register_model("gpt", bob.submit(**JOB).id)

    # a stranger: the model does not exist, and its owner is not named
    assert mallory.models() == []
    for attempt in (
        lambda: mallory.model("gpt"),
        lambda: mallory.model_version("gpt", 1),
        lambda: mallory.download_model("gpt", "production", tmp_path / "stolen"),
        lambda: mallory.set_alias("gpt", "production", 2),
        lambda: mallory.delete_model_version("gpt", 1),
    ):
        with pytest.raises(NotFound) as refused:
            attempt()
        assert "alice" not in str(refused.value)
    assert not (tmp_path / "stolen").exists()
    # nor can the stranger make versions of someone else's job, or take the name
    with pytest.raises(Forbidden):
        mallory.register_model("mine", job_id)
    with pytest.raises(NotFound):
        mallory.register_model("gpt", mallory.submit(**JOB).id)
    # lineage: the versions made from the job, as each caller may see them
    lineage = alice._http.get(f"/v1/jobs/{job_id}/models").json()
    assert [(v["model"], v["version"]) for v in lineage] == [("gpt", 1), ("gpt", 2)]
    assert mallory._http.get(f"/v1/jobs/{job_id}/models").json() == []


def test_a_file_changed_on_disk_is_refused_not_served(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    alice = clients["alice"]
    alice.register_model("gpt", alices_job(alice, repo, roots[0]), step=10)
    stored = roots[1] / "gpt" / "v1" / "__0_0.distcp"
    stored.chmod(0o644)
    stored.write_bytes(b"injected weights")
    with pytest.raises(Conflict, match="changed since it was registered"):
        alice.download_model("gpt", 1, tmp_path / "got")
    assert not (tmp_path / "got" / "__0_0.distcp").exists()
    raw = alice._http.get("/v1/models/gpt/versions/1/files/__0_0.distcp")
    assert raw.status_code == 409 and b"injected" not in raw.content


def test_a_link_in_a_checkpoint_copies_nothing_of_the_service(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """The rank program writes the checkpoint: it may plant links to the service's files."""
    secret = tmp_path / "service-secret"
    secret.write_bytes(b"GANGWAY_ADMIN_KEY=...")
    alice = clients["alice"]
    job_id = alice.submit(**JOB).id
    folder = checkpoint(roots[0], job_id, 5, SHARDS)
    (folder / "leak.distcp").symlink_to(secret)
    (folder / "dir").symlink_to(tmp_path, target_is_directory=True)
    made = alice.register_model("gpt", job_id)
    assert sorted(f.path for f in made.files) == sorted(SHARDS)
    assert not any(p.is_symlink() for p in (roots[1] / "gpt" / "v1").rglob("*"))


def test_bad_requests_name_the_field(clients: dict[str, Client], repo: JobRepository) -> None:
    alice = clients["alice"]
    job_id = alice.submit(**JOB).id  # no checkpoint yet
    with pytest.raises(ValidationFailed) as none_yet:
        alice.register_model("gpt", job_id)
    assert none_yet.value.field == "job_id"
    with pytest.raises(ValidationFailed) as bad_name:
        alice.register_model("../etc", job_id)
    assert bad_name.value.field == "name"
    with pytest.raises(NotFound):
        alice.register_model("gpt", 999)
    raw = alice._http.put("/v1/models/gpt/aliases/123", json={"version": 1})
    assert raw.status_code == 422  # an alias is never a number


def test_jobs_start_from_versions_they_may_read(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path]
) -> None:
    alice, bob, mallory = clients["alice"], clients["bob"], clients["mallory"]
    alice.register_model("gpt", alices_job(alice, repo, roots[0]), step=10, readers=["bob"])
    alice.set_alias("gpt", "production", 1)
    started = bob.submit(**JOB | {"init_from": {"model": "gpt", "version": "production"}})
    assert started.spec.init_from is not None and started.spec.init_from.version == 1  # pinned
    for ref in ({"model": "gpt", "version": 1}, {"model": "nope", "version": 1}):
        with pytest.raises(ValidationFailed) as refused:
            mallory.submit(**JOB | {"init_from": ref})
        assert refused.value.field == "init_from" and "alice" not in str(refused.value)
    other = {"kind": "builtin", "model": "gpt-mini", "steps": 5}
    with pytest.raises(ValidationFailed, match="is a gpt-tiny; this job trains a gpt-mini"):
        bob.submit(**JOB | {"entrypoint": other, "init_from": {"model": "gpt", "version": 1}})


def test_an_export_is_a_job_of_the_callers_started_from_the_version(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path]
) -> None:
    alice, bob, mallory = clients["alice"], clients["bob"], clients["mallory"]
    alice.register_model("gpt", alices_job(alice, repo, roots[0]), step=10, readers=["bob"])
    answer = bob._http.post("/v1/models/gpt/versions/1/export", json={"quantize": "int8"})
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert (job["user"], job["spec"]["init_from"]) == ("bob", {"model": "gpt", "version": 1})
    kwargs = job["spec"]["entrypoint"]["kwargs"]
    assert (kwargs["model"], kwargs["quantize"], kwargs["eval_batch"]) == ("gpt-tiny", "int8", 8)
    stolen = mallory._http.post("/v1/models/gpt/versions/1/export", json={})
    assert stolen.status_code == 404


def test_the_status_page_lists_only_readable_models(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path]
) -> None:
    alice, bob, mallory = clients["alice"], clients["bob"], clients["mallory"]
    job_id = alices_job(alice, repo, roots[0])
    alice.register_model("gpt", job_id, step=10, readers=["bob"])
    alice.set_alias("gpt", "production", 1)
    shown = bob._http.get("/ui/models").text
    assert "gpt" in shown and f'href="/jobs/{job_id}"' in shown and "production" in shown
    assert "val_loss 2.5" in shown
    hidden = mallory._http.get("/ui/models").text
    assert "gpt" not in hidden and "alice" not in hidden


def test_an_owner_cannot_fill_the_disk_with_versions_or_outputs(
    repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """Outputs and model versions share one storage quota: a user cannot dodge it by
    moving bytes from one to the other."""
    outputs = tmp_path / "outputs"
    app = create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        checkpoint_root=roots[0],
        models_root=roots[1],
        outputs_root=outputs,
        storage_quota_bytes=59,  # one version of SHARDS (27 bytes) and a few bytes more
    )
    admin = as_user(app, ADMIN_KEY)
    admin.create_user("alice")
    alice = as_user(app, admin.issue_key("alice").secret)
    job_id = alices_job(alice, repo, roots[0])
    written = job_outputs_dir(outputs, job_id) / "rank-0"
    written.mkdir(parents=True)
    (written / "big.bin").write_bytes(b"x" * 40)
    with pytest.raises(Conflict, match=r"alice's files hold 40 bytes of their 59 \(0 in model"):
        alice.register_model("gpt", job_id, step=10)
    (written / "big.bin").unlink()  # the rank folder changes: its usage is walked again
    (written / "small.bin").write_bytes(b"x" * 6)
    assert alice.register_model("gpt", job_id, step=10).version == 2  # 1 went to the refusal
    usage = alice.outputs_page(job_id).usage
    assert usage is not None and (usage.used_bytes, usage.model_bytes) == (33, 27)
    with pytest.raises(Conflict, match=r"alice's files hold 33 bytes of their 59 \(27 in model"):
        alice.register_model("gpt", job_id, step=10)
    assert [p.name for p in (roots[1] / "gpt").iterdir()] == ["v2"]


def test_a_step_folder_linked_to_another_jobs_checkpoint_is_not_taken(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """A rank may plant `step-99999999 -> <another job's checkpoint>` in its own folder,
    and a FIFO that would block whoever opens it: neither is read."""
    alice, mallory = clients["alice"], clients["mallory"]
    victim = alices_job(alice, repo, roots[0])
    attacker = mallory.submit(**JOB).id
    own = checkpoint(roots[0], attacker, 1, {".metadata": b"m", "__0_0.distcp": b"mine"})
    os.mkfifo(own / "pipe.distcp")
    stolen = job_directory(roots[0], attacker) / "step-99999999"
    stolen.symlink_to(checkpoint_path(job_directory(roots[0], victim), 20))
    made = mallory.register_model("loot", attacker)
    assert made.step == 1 and sorted(f.path for f in made.files) == [".metadata", "__0_0.distcp"]
    got = mallory.download_model("loot", 1, tmp_path / "got")
    assert b"shard" not in b"".join(p.read_bytes() for p in got)


def test_version_numbers_are_never_reused(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path]
) -> None:
    """A job that pinned gpt v2 never finds other weights under that number: not after v2
    is deleted and another registered, nor after every version is deleted and a
    stranger asks for the name."""
    alice, mallory = clients["alice"], clients["mallory"]
    job_id = alices_job(alice, repo, roots[0])
    alice.register_model("gpt", job_id, step=10)
    alice.register_model("gpt", job_id, step=20)
    alice.delete_model_version("gpt", 2)
    assert alice.register_model("gpt", job_id, step=20).version == 3
    alice.delete_model_version("gpt", 1)
    alice.delete_model_version("gpt", 3)
    with pytest.raises(NotFound):  # the name stays alice's
        mallory.register_model("gpt", mallory.submit(**JOB).id)
    for ref in ("99999999999999999999", "2147483648"):
        assert alice._http.get(f"/v1/models/gpt/versions/{ref}").status_code == 404
    too_big = {"model": "gpt", "version": 10**30}
    with pytest.raises(ValidationFailed) as refused:
        alice.submit(**JOB | {"init_from": too_big})
    assert refused.value.field is not None and refused.value.field.startswith("init_from")


# -- a queue's members: the team that submits to it and reads what is shared with it ----


def test_a_queue_with_members_takes_only_their_jobs(clients: dict[str, Client]) -> None:
    """Membership is an admin's to give: submitting to a queue, or asking to be added,
    makes no one a member; a refused submit stores nothing."""
    admin, alice, mallory = clients["admin"], clients["alice"], clients["mallory"]
    info = admin.set_queue_members("research", ["alice", "bob"])
    assert info.members == ["alice", "bob"]
    assert alice.whoami().queues == ["research"]
    alice.submit(**JOB | {"queue": "research"})
    before = len(admin.list().items)
    with pytest.raises(Forbidden, match="queue 'research' is for its members") as refused:
        mallory.submit(**JOB | {"queue": "research"})
    assert refused.value.field == "queue"
    step = {**JOB, "queue": "research"}
    pipeline = mallory._http.post("/v1/pipelines", json={"name": "p", "jobs": [step]})
    assert (pipeline.status_code, pipeline.json()["error"]["field"]) == (403, "jobs.0.queue")
    sweep = {
        "name": "s",
        "base": step,
        "space": {"entrypoint.lr": {"kind": "choice", "values": [0.1, 0.2]}},
    }
    assert mallory._http.post("/v1/sweeps", json=sweep).status_code == 403
    estimate = mallory._http.post("/v1/estimate", json=step)
    assert (estimate.status_code, estimate.json()["error"]["field"]) == (403, "queue")
    with pytest.raises(Forbidden, match="mallory is not one"):  # an admin, for a non-member
        admin.submit(**JOB | {"queue": "research", "user": "mallory"})
    assert len(admin.list().items) == before
    admin.submit(**JOB | {"queue": "research"})  # an admin's own job goes anywhere
    with pytest.raises(Forbidden):
        mallory.set_queue_members("research", ["mallory"])
    mallory.submit(**JOB)  # the default queue stays open to everyone ...
    assert mallory.whoami().queues == []  # ... and a job in it makes no member
    with pytest.raises(ValidationFailed) as unknown:
        admin.set_queue_members("research", ["alice", "nobody"])
    assert unknown.value.field == "members.1"
    admin.set_queue_members("research", [])  # open again
    mallory.submit(**JOB | {"queue": "research"})


def test_a_model_shared_with_a_queue_is_read_by_its_members_only(
    clients: dict[str, Client], repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    admin, alice, bob, mallory = (clients[n] for n in ("admin", "alice", "bob", "mallory"))
    with pytest.raises(ValidationFailed, match="queue 'research' has no members") as open_queue:
        alice.register_model("gpt", alices_job(alice, repo, roots[0]), readers=["queue:research"])
    assert open_queue.value.field == "readers.0"
    admin.set_queue_members("research", ["alice", "bob"])
    job_id = alices_job(alice, repo, roots[0])
    alice.register_model("gpt", job_id, step=10, readers=["queue:research"])
    assert [m.name for m in bob.models()] == ["gpt"]
    got = bob.download_model("gpt", 1, tmp_path / "got")
    assert {p.name: p.read_bytes() for p in got} == SHARDS
    bob.submit(**JOB | {"init_from": {"model": "gpt", "version": 1}})
    exported = bob._http.post("/v1/models/gpt/versions/1/export", json={"queue": "research"})
    assert exported.status_code == 201 and exported.json()["queue"] == "research"
    admin.set_queue_members("default", ["alice"])  # the export's default queue is a team's
    refused_export = bob._http.post("/v1/models/gpt/versions/1/export", json={})
    assert (refused_export.status_code, refused_export.json()["error"]["field"]) == (403, "queue")
    admin.set_queue_members("default", [])
    # a stranger reads nothing, and cannot start from it
    assert mallory.models() == []
    with pytest.raises(NotFound):
        mallory.model("gpt")
    with pytest.raises(ValidationFailed) as refused:
        mallory.submit(**JOB | {"init_from": {"model": "gpt", "version": 1}})
    assert refused.value.field == "init_from"
    # leaving the team ends the reading at once
    admin.set_queue_members("research", ["alice"])
    with pytest.raises(NotFound):
        bob.model("gpt")
    with pytest.raises(NotFound):
        bob.download_model("gpt", 1, tmp_path / "again")
