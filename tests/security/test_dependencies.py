"""Dependencies between jobs as an attacker meets them through the public API (auth on):
a plain user cannot make a job wait for another user's job (so another user's cancel
cannot steer theirs, nor theirs probe another's progress through its own), nor start from
another user's checkpoint (a stranger's weights); each refusal is a 422 naming the field,
and nothing is stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from api.app import create_app
from api.auth import AuthConfig
from gangway import Client, Forbidden, ValidationFailed
from gangway.models import submit_body
from scheduler.core.asha import TrialState
from scheduler.model import Node
from scheduler.store import JobRepository, NewJob
from tests.security.test_model_registry import ADMIN_KEY, as_user

JOB = {"name": "pretrain", "entrypoint": {"kind": "builtin", "steps": 20}}


@pytest.fixture
def app(repo: JobRepository, tmp_path: Path) -> FastAPI:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0)])
    return create_app(
        repo,
        auth=AuthConfig(required=True, admin_key=ADMIN_KEY),
        checkpoint_root=tmp_path / "checkpoints",
    )


@pytest.fixture
def clients(app: FastAPI) -> Iterator[dict[str, Client]]:
    admin = as_user(app, ADMIN_KEY)
    made = {"admin": admin}
    for name in ("alice", "mallory"):
        admin.create_user(name)
        made[name] = as_user(app, admin.issue_key(name).secret)
    yield made


def test_a_user_cannot_wait_for_or_start_from_another_users_job(
    clients: dict[str, Client], repo: JobRepository
) -> None:
    victim = clients["alice"].submit(**JOB)
    before = len(repo.page(limit=100))
    attacks = {
        "depends_on.0.job": {"depends_on": [{"job": victim.id, "on": "started"}]},
        "init_from.job": {"init_from": {"job": victim.id}},
    }
    for field, fields in attacks.items():
        with pytest.raises(ValidationFailed) as refused:
            clients["mallory"].submit(**{**JOB, "name": "steal", **fields})
        assert refused.value.status_code == 422 and refused.value.field == field
        assert f"job {victim.id} is not mallory's" in refused.value.message
    assert len(repo.page(limit=100)) == before  # nothing stored

    # The owner may; an admin may name anyone's job.
    own = clients["alice"].submit(**{**JOB, "name": "next", "init_from": {"job": victim.id}})
    assert [link.job for link in own.dependencies().upstream] == [victim.id]
    assert own.dependencies().upstream[0].on == "succeeded"  # init_from waits for success
    admin = clients["admin"].submit(
        **{**JOB, "name": "ops", "user": "alice", "depends_on": [{"job": victim.id}]}
    )
    assert admin.explain().upstream[0].job == victim.id


def test_a_stranger_reads_a_sweep_without_its_env_and_cannot_cancel_it(
    clients: dict[str, Client], repo: JobRepository
) -> None:
    """A sweep shows what its jobs show: env values (a token a base job carries, a
    searched env value) only to its owner and admins; only they end it."""
    sweep = clients["alice"].submit_sweep(
        name="lr",
        base={**JOB, "env": {"HF_TOKEN": "hf_secret_value"}},
        space={"env.WARMUP": {"kind": "choice", "values": ["10", "20"]}},
        max_trials=2,
    )
    done = clients["alice"].submit(**{**JOB, "env": {"HF_TOKEN": "hf_secret_value"}})
    body = submit_body(done.spec) | {"env": {"HF_TOKEN": "hf_secret_value", "WARMUP": "20"}}
    new = NewJob("lr-0", "default", 0, body, 1, 20, user="alice")
    repo.add_trial(sweep.id, 0, {"env.WARMUP": "20"}, new, "trial 0")
    repo.update_trial(sweep.id, 0, state=TrialState.COMPLETED, values={0: 1.5})
    seen = clients["mallory"].sweep(sweep.id)
    assert seen.best is not None and seen.trials[0].params == {"env.WARMUP": "***"}
    assert "hf_secret_value" not in seen.model_dump_json()
    owner = clients["alice"].sweep(sweep.id)
    assert owner.best is not None and owner.best.job.env["HF_TOKEN"] == "hf_secret_value"
    assert owner.trials[0].params == {"env.WARMUP": "20"}
    with pytest.raises(Forbidden):
        clients["mallory"].cancel_sweep(sweep.id)
    with pytest.raises(ValidationFailed) as refused:  # a sweep from a stranger's weights
        clients["mallory"].submit_sweep(
            name="steal",
            base={**JOB, "init_from": {"job": clients["alice"].submit(**JOB).id}},
            space={"entrypoint.learning_rate": {"kind": "log_uniform", "low": 1e-4, "high": 1}},
        )
    assert refused.value.field == "init_from.job"
    assert clients["alice"].cancel_sweep(sweep.id).state == "CANCELLED"
