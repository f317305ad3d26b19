"""Attack: a JSON body nested far deeper than any job needs, to crash the request with a
RecursionError (a 500) or to burn the service's CPU. Against the app `gangway serve`
builds from its settings (`served`: no loop, no Ray)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.test_limits import error_of
from tests.integration.test_safety_over_http import served

JSON = {"content-type": "application/json"}
LIMIT = 64  # GANGWAY_MAX_JSON_DEPTH's default
DEEP = 1000


def arrays(depth: int, inner: str = "") -> str:
    """`[[[...]]]`, `depth` brackets deep."""
    return "[" * depth + inner + "]" * depth


def in_kwargs(value: str) -> str:
    """A job body whose function kwargs hold `value`: three levels (body, entrypoint,
    kwargs) around it."""
    return (
        '{"name": "x", "entrypoint": {"kind": "function", '
        '"target": "workers.examples:sleep_steps", "kwargs": {"steps": ' + value + "}}}"
    )


def assert_depth_refused(answer: httpx.Response) -> None:
    """A 422 in the one error shape whose message names the limit and its setting."""
    assert answer.status_code == 422, answer.text
    assert error_of(answer)[:2] == (422, "validation_error")
    message = answer.json()["error"]["message"]
    assert f"{LIMIT} levels" in message and "GANGWAY_MAX_JSON_DEPTH" in message


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs"),
        ("POST", "/v1/estimate"),
        ("PATCH", "/v1/jobs/1"),
        ("POST", "/v1/jobs/1/cancel"),
        ("PUT", "/v1/queues/research"),
        ("POST", "/v1/users"),
        ("POST", "/v1/no-such-route"),
    ],
)
def test_nesting_past_the_limit_is_a_422_on_every_route(
    database_url: str, tmp_path: Path, method: str, path: str
) -> None:
    api = served(database_url, tmp_path, auth=False)
    hidden = '["\u4122", ' + arrays(DEEP) + "]"  # in UTF-16 this character holds a quote byte
    for document in (
        arrays(DEEP).encode(),
        in_kwargs(arrays(DEEP)).encode(),
        ('{"a": ' * DEEP + "1" + "}" * DEEP).encode(),
        hidden.encode("utf-16-le"),  # json.loads reads UTF-16 and UTF-32 too
        hidden.encode("utf-32"),
    ):
        assert_depth_refused(api.request(method, path, content=document, headers=JSON))
    assert api.get("/v1/jobs").json()["items"] == []


def test_the_limit_counts_brackets_outside_strings_only(database_url: str, tmp_path: Path) -> None:
    api = served(database_url, tmp_path, auth=False)
    over = in_kwargs(arrays(LIMIT - 2))  # 3 levels around it: LIMIT + 1 in all
    assert_depth_refused(api.post("/v1/jobs", content=over, headers=JSON))
    # Exactly at the limit, with brackets, braces and escaped quotes inside strings.
    noise = json.dumps('\\"[{' * DEEP + '"\\')
    at_limit = in_kwargs(arrays(LIMIT - 3, inner=noise))
    accepted = api.post("/v1/jobs", content=at_limit, headers=JSON)
    assert accepted.status_code == 201, accepted.text


def test_a_mebibyte_of_brackets_is_refused_at_once(database_url: str, tmp_path: Path) -> None:
    """The largest body the service reads (GANGWAY_MAX_BODY_BYTES): refused after the
    first levels, and a body that must be scanned whole is scanned in linear time."""
    api = served(database_url, tmp_path, auth=False)
    started = time.monotonic()
    assert_depth_refused(api.post("/v1/jobs", content=b"[" * 1024 * 1024, headers=JSON))
    shallow = b"[" + b"[]," * 349_000 + b"[]]"  # just under 1 MiB, two levels, all scanned
    answer = api.post("/v1/jobs", content=shallow, headers=JSON)
    assert error_of(answer)[:2] == (422, "validation_error")  # not a job body: the route says so
    assert time.monotonic() - started < 10  # seconds; quadratic work would take hours
