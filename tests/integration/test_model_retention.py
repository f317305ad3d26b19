"""Model versions under the retention jobs' files have: past the age a version goes,
rows and files, unless an alias names it, it is its model's newest, or a job that has not
ended (or a running sweep's trials) start from it. Versions are made through the public
API; the sweep runs with a clock moved past the age."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from gangway import Client
from scheduler.model import Node
from scheduler.store import JobRepository
from scheduler.store.model_files import version_directory
from scheduler.store.model_retention import ModelVersionSweeper
from scheduler.store.registry import ModelRegistry
from scheduler.store.remote_models import RemoteModelFiles
from workers.checkpoint_layout import checkpoint_path, job_directory

AGE = timedelta(days=30)
JOB = {"name": "pretrain", "entrypoint": {"kind": "builtin", "steps": 20}}


@pytest.fixture
def client(repo: JobRepository, tmp_path: Path) -> Iterator[Client]:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    app = create_app(repo, checkpoint_root=tmp_path / "ckpt", models_root=tmp_path / "models")
    client = Client("http://testserver")
    client._http = TestClient(app)
    yield client


def sweeper(repo: JobRepository, root: Path, days_later: int) -> ModelVersionSweeper:
    return ModelVersionSweeper(
        ModelRegistry(repo.engine),
        root,
        repo,
        AGE,
        clock=lambda: repo.now() + timedelta(days=days_later),
    )


def registered(client: Client, root: Path, versions: int) -> None:
    """`versions` versions of model gpt, from one job's checkpoint."""
    trained = client.submit(**JOB).id
    folder = checkpoint_path(job_directory(root, trained), 10)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"weights")
    (folder / ".metadata").write_bytes(b"m")
    for _ in range(versions):
        client.register_model("gpt", trained)


def test_old_unnamed_unused_versions_go_named_newest_and_used_ones_stay(
    client: Client, repo: JobRepository, tmp_path: Path
) -> None:
    registered(client, tmp_path / "ckpt", 5)
    client.set_alias("gpt", "production", 2)
    user = client.submit(**JOB | {"init_from": {"model": "gpt", "version": 1}})
    models = tmp_path / "models"

    assert sweeper(repo, models, days_later=29).sweep().removed == []  # not old enough
    swept = sweeper(repo, models, days_later=31).sweep()
    assert swept.removed == [version_directory(models, "gpt", n) for n in (3, 4)]
    assert [v.version for v in client.model("gpt").versions] == [1, 2, 5]
    assert not version_directory(models, "gpt", 3).exists()
    assert version_directory(models, "gpt", 1).is_dir()

    client.cancel(user.id)  # nothing starts from v1 any more
    swept = sweeper(repo, models, days_later=31).sweep()
    assert swept.removed == [version_directory(models, "gpt", 1)]
    shown = client.model("gpt")
    assert ([v.version for v in shown.versions], shown.aliases) == ([2, 5], {"production": 2})


def test_a_running_sweeps_base_and_an_alias_set_meanwhile_keep_their_versions(
    client: Client, repo: JobRepository, tmp_path: Path
) -> None:
    registered(client, tmp_path / "ckpt", 4)
    repo.create_sweep("s", "default", {"base": {"init_from": {"model": "gpt", "version": 1}}})
    registry, models = ModelRegistry(repo.engine), tmp_path / "models"
    before = repo.now() + timedelta(days=1)
    assert [v.version for v in registry.unnamed_versions(before=before)] == [1, 2, 3]
    client.set_alias("gpt", "staging", 2)  # after a sweep listed it, before it deletes
    assert not registry.delete_unnamed_version("gpt", 2, before=before)
    # a folder an earlier sweep renamed and could not delete is found by its new name
    stuck = models / "gpt" / ".deleting-v9"
    stuck.mkdir()
    (stuck / "shard").write_bytes(b"x")
    swept = sweeper(repo, models, days_later=31).sweep()
    gone = [version_directory(models, "gpt", n) for n in (9, 3)]
    assert (swept.removed, swept.failed) == (gone, [])
    assert not stuck.exists()
    assert [v.version for v in client.model("gpt").versions] == [1, 2, 4]


def test_with_a_store_the_sweep_deletes_the_versions_files_there(
    repo: JobRepository, tmp_path: Path
) -> None:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    store = RemoteModelFiles(f"memory://retention-{tmp_path.name}/models")
    app = create_app(
        repo,
        checkpoint_root=tmp_path / "ckpt",
        models_root=tmp_path / "models",
        model_store=store,
    )
    client = Client("http://testserver")
    client._http = TestClient(app)
    registered(client, tmp_path / "ckpt", 2)
    assert store.fs.exists(store.version_url("gpt", 1))
    swept = ModelVersionSweeper(
        ModelRegistry(repo.engine),
        tmp_path / "models",
        repo,
        AGE,
        clock=lambda: repo.now() + timedelta(days=31),
        store=store,
    ).sweep()
    assert swept.removed == [store.version_url("gpt", 1)]  # v2, the newest, stays
    assert not store.fs.exists(store.version_url("gpt", 1))
    assert store.fs.exists(store.version_url("gpt", 2)) and not (tmp_path / "models").exists()
