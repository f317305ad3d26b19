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
from scheduler.store.records import ReportedPoint
from workers.engine.checkpoint_layout import checkpoint_path, job_directory

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


def test_an_owner_cannot_fill_the_disk_with_versions(
    repo: JobRepository, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    app = create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        checkpoint_root=roots[0],
        models_root=roots[1],
        models_quota_bytes=50,  # two versions of SHARDS (27 bytes each) do not fit
    )
    admin = as_user(app, ADMIN_KEY)
    admin.create_user("alice")
    alice = as_user(app, admin.issue_key("alice").secret)
    job_id = alices_job(alice, repo, roots[0])
    alice.register_model("gpt", job_id, step=10)
    with pytest.raises(Conflict, match="alice's models hold 27 bytes of their 50"):
        alice.register_model("gpt", job_id, step=10)
    assert not (roots[1] / "gpt" / "v2").exists()


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
