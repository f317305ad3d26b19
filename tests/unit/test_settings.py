"""Settings come from GANGWAY_* variables and build the policy the loop runs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.settings import Settings
from scheduler.core import PolicyConfig
from scheduler.core.fairshare import HALF_LIFE_S
from scheduler.model import QueueQuota
from scheduler.runtime.lifecycle import LifecycleConfig


def test_queues_and_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "GANGWAY_QUEUES", '{"research": {"guaranteed_gpus": 4, "borrow_limit_gpus": 2}}'
    )
    monkeypatch.setenv("GANGWAY_MIN_RUNTIME_S", "30")
    monkeypatch.setenv("GANGWAY_BACKFILL", "false")
    monkeypatch.setenv("GANGWAY_RESERVATIONS", "true")
    monkeypatch.setenv("GANGWAY_LARGER_GANGS_FIRST", "true")
    monkeypatch.setenv("GANGWAY_SMALLER_VICTIMS_FIRST", "true")
    settings = Settings()
    assert settings.quotas() == {"research": QueueQuota(guaranteed_gpus=4, borrow_limit_gpus=2)}
    policy = settings.policy()
    assert (policy.min_runtime_s, policy.backfill, policy.preemption) == (30.0, False, True)
    assert policy.reservations
    assert (policy.larger_gangs_first, policy.smaller_victims_first) == (True, True)


def test_the_hang_rule_and_start_timeout_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GANGWAY_HANG_MIN_S", "120")
    monkeypatch.setenv("GANGWAY_START_TIMEOUT_S", "900")
    assert Settings().lifecycle() == LifecycleConfig(hang_min_s=120, start_timeout_s=900)


def test_policy_defaults_are_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"GANGWAY_{name.upper()}", raising=False)
    settings = Settings()
    assert settings.policy() == PolicyConfig()
    assert settings.lifecycle() == LifecycleConfig()
    assert settings.fair_share_half_life_s == HALF_LIFE_S


def test_bad_queue_settings_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANGWAY_QUEUES", '{"research": {"guaranteed_gpus": -1}}')
    with pytest.raises(ValidationError, match="guaranteed_gpus"):
        Settings()


def test_queue_settings_are_the_api_spec_read_laxly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANGWAY_QUEUES", '{"q": {"guaranteed_gpus": "4", "weight": 2}}')
    assert Settings().quotas() == {"q": QueueQuota(guaranteed_gpus=4, weight=2.0)}
    monkeypatch.setenv("GANGWAY_QUEUES", '{"q": {"guaranteed_gpus": 2000000}}')
    with pytest.raises(ValidationError, match="guaranteed_gpus"):  # the API's bound
        Settings()


def test_default_database_is_sqlite_in_the_data_dir(tmp_path: object) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.resolved_database_url() == f"sqlite:///{tmp_path}/gangway.db"
