"""A job's spec on the wire: the stored body is validated on its first read and then
served from a cache while it is unchanged, with the same bytes as validating every time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api import convert
from api.convert import _SpecCache, job_info
from gangway.models import JobSubmit
from scheduler.model import JobState
from scheduler.store import JobRecord
from scheduler.store.specs import spec_from_json

T0 = datetime(2026, 1, 1, tzinfo=UTC)

BODIES: list[dict[str, Any]] = [
    {"name": "defaults", "entrypoint": {}},
    {
        "name": "elastic",
        "parallelism": {"dp": {"min": 1, "max": 4}, "tp": 2, "fsdp": True},
        "entrypoint": {"kind": "builtin", "steps": 7, "learning_rate": 1e-5},
        "checkpoint": {"interval_steps": 5, "keep_last": 3},
        "time_limit_s": 60,
    },
    {
        "name": "placed",
        "priority": 5,
        "queue": "q",
        "max_restarts": 2,
        "preemptible": False,
        "resources": {"gpus_per_rank": 2, "cpus_per_rank": 0.5},
        "entrypoint": {"kind": "builtin", "max_grad_norm": None},
    },
    {
        "name": "function",
        "entrypoint": {"kind": "function", "target": "a.b:c", "kwargs": {"x": 1.0, "y": True}},
        "env": {"A": "1"},
        "requirements": ["numpy"],
    },
    {"name": "script", "entrypoint": {"kind": "script", "path": "t.py", "args": ["--n", "1"]}},
    {"name": "command", "entrypoint": {"kind": "command", "argv": ["echo", "hi"]}},
]


def stored(body: dict[str, Any]) -> dict[str, Any]:
    return JobSubmit.model_validate(body).model_dump(mode="json")


def record(spec_json: dict[str, Any], job_id: int = 1) -> JobRecord:
    return JobRecord(
        id=job_id,
        name="j",
        queue="default",
        user="u",
        priority=0,
        state=JobState.PENDING,
        spec=spec_from_json(spec_json),
        num_gpus=1,
        submitted_at=T0 + timedelta(seconds=job_id),
        updated_at=T0,
        admitted_at=None,
        started_at=None,
        finished_at=None,
        status_reason="",
        error=None,
        attempt=0,
        restarts=0,
        placement=None,
        step=0,
        total_steps=None,
        loss=None,
        first_loss=None,
        tokens_per_s=None,
        progress_at=None,
        estimated_start_at=None,
        explanation=None,
        preempt_deadline=None,
        spec_json=spec_json,
    )


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every JobSubmit validation from here on."""
    seen: list[object] = []
    original = JobSubmit.model_validate

    def counting(obj: object, *args: Any, **kwargs: Any) -> JobSubmit:
        seen.append(obj)
        return original(obj, *args, **kwargs)

    monkeypatch.setattr(JobSubmit, "model_validate", counting)
    return seen


@pytest.mark.parametrize("body", BODIES, ids=[b["name"] for b in BODIES])
def test_the_wire_spec_is_the_validated_one_and_read_once(
    body: dict[str, Any], validations: list[object]
) -> None:
    cache = _SpecCache(max_bytes=1 << 20, max_item_bytes=1 << 20)
    spec_json = stored(body)
    expected = JobSubmit.model_validate(spec_json).model_dump_json()
    validations.clear()
    for _ in range(3):
        assert cache.get(record(spec_json)).model_dump_json() == expected
    assert len(validations) == 1


def test_job_info_lists_the_same_bytes_as_validating_each_row() -> None:
    spec_json = stored(BODIES[1])
    info = job_info(record(spec_json), {}, shows_env=True)
    again = job_info(record(spec_json), {}, shows_env=True)
    assert again.spec is info.spec  # the second read came from the cache
    assert info.spec.model_dump_json() == JobSubmit.model_validate(spec_json).model_dump_json()
    assert convert.submitted_spec(record(spec_json)) is info.spec


def test_a_row_stored_before_a_field_existed_takes_its_default() -> None:
    old = stored(BODIES[1])
    del old["requirements"], old["entrypoint"]["warmup_steps"], old["preemptible"]
    spec = _SpecCache(max_bytes=1 << 20, max_item_bytes=1 << 20).get(record(old))
    assert spec.model_dump_json() == JobSubmit.model_validate(stored(BODIES[1])).model_dump_json()


def test_a_different_spec_under_the_same_key_is_validated_afresh(
    validations: list[object],
) -> None:
    """Another database in the same process, or an id reused: never a stale answer."""
    cache = _SpecCache(max_bytes=1 << 20, max_item_bytes=1 << 20)
    first, second = stored(BODIES[0]), stored(BODIES[2])
    assert cache.get(record(first)).name == "defaults"
    assert cache.get(record(second)).name == "placed"
    assert cache.get(record(second)).name == "placed"
    assert len(validations) == 4  # two to store, two to read


def test_the_cache_keeps_to_its_budget_dropping_the_least_recently_read(
    validations: list[object],
) -> None:
    spec_json = stored(BODIES[0])
    size = len(convert.json.dumps(spec_json))
    cache = _SpecCache(max_bytes=3 * size, max_item_bytes=size)
    jobs = [record(spec_json, job_id) for job_id in (1, 2, 3)]
    for job in jobs:
        cache.get(job)
    cache.get(jobs[0])  # 1 is now the most recent; 2 the least
    cache.get(record(spec_json, 4))  # over budget: 2 goes
    validations.clear()
    cache.get(jobs[0])
    cache.get(jobs[2])
    assert validations == []
    cache.get(jobs[1])
    assert len(validations) == 1


def test_a_spec_too_large_for_the_cache_is_validated_on_every_read(
    validations: list[object],
) -> None:
    big = stored({**BODIES[0], "env": {f"V{i}": "x" * 1000 for i in range(20)}})
    cache = _SpecCache(max_bytes=1 << 20, max_item_bytes=8 * 1024)
    job = record(big)
    validations.clear()
    cache.get(job)
    cache.get(job)
    assert len(validations) == 2
