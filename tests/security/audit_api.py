"""What the audit's attacks share: the app `gangway serve` builds from its settings, with
auth on and two plain users (alice, bob) plus an admin, reached over HTTP only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.integration.test_auth import ADMIN_KEY, bearer, new_user
from tests.integration.test_safety_over_http import served

BUILTIN: dict[str, Any] = {"name": "j", "entrypoint": {"kind": "builtin", "steps": 5}}
ADMIN = bearer(ADMIN_KEY)


def audited(database_url: str, tmp_path: Path, **settings: Any) -> TestClient:
    """Auth on, the default policy unless `settings` say otherwise."""
    return served(database_url, tmp_path, auth=True, admin_key=ADMIN_KEY, **settings)


def users(api: TestClient) -> tuple[dict[str, str], dict[str, str]]:
    """Headers for alice and bob, two plain users."""
    return new_user(api, "alice"), new_user(api, "bob")


def refusal(response: httpx.Response) -> tuple[int, str | None]:
    """(status, the field the error names; None for an answer that is no error), so an
    attack that succeeds fails its test on the status, not on the body's shape."""
    body = response.json() if response.content else None
    error = body.get("error") if isinstance(body, dict) else None
    return response.status_code, error.get("field") if isinstance(error, dict) else None
