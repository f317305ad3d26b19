"""Schemathesis against the real app: generated requests for every operation in the
OpenAPI document must never get a 5xx or a response the document does not describe, and a
request the document forbids must be refused. Every default check runs but one:
`positive_data_acceptance`, since a submission can be schema-valid and still refused with
a 422 naming the field (a script path that does not exist, more GPUs than any node has, a
plan the model cannot split): the document describes shape, the API also checks meaning.

Auth is on and every generated request carries the bootstrap admin key (so the admin
routes are reached too); schemathesis' own auth check sends wrong and missing keys and
expects a 401. It runs once on SQLite and once on PostgreSQL (the database fixture's
parameters): text that one accepts and the other refuses (a NUL byte) must be a 422 on
both, never a 500 on one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from api.app import create_app
from api.auth import AuthConfig
from scheduler.model import Node
from scheduler.store import JobRepository, make_engine, upgrade_to_head

NODES = [Node("id-1", "local-1", 4, 8.0), Node("id-2", "local-2", 4, 8.0)]
ADMIN_KEY = "schema-tests-bootstrap-key"


class SwitchedApp:
    """The ASGI app schemathesis calls: the document is read once, at import, from an app
    on a throwaway SQLite file; each test then points it at an app on its own database."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _app(repo: JobRepository) -> Any:
    repo.replace_nodes(NODES)
    return create_app(repo, auth=AuthConfig(required=True, admin_key=ADMIN_KEY))


def _document_app() -> Any:
    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='gangway-schema-')) / 'gangway.db'}"
    upgrade_to_head(url)
    return _app(JobRepository(make_engine(url)))


SWITCH = SwitchedApp(_document_app())
schema = schemathesis.openapi.from_asgi("/openapi.json", SWITCH)
# A negative case can also be refused for its size (a body over the limit) before it is
# parsed: a 413 rejects it as surely as a 422.
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]


@pytest.fixture
def on_each_database(repo: JobRepository) -> Iterator[None]:
    """SQLite, then PostgreSQL (the `repo` fixture's parameters)."""
    SWITCH.app = _app(repo)
    yield


@schema.auth()
class BootstrapAdmin:
    """Schemathesis' auth hook: it sets the key on the cases it means to be authorized and
    leaves the ones it mutates to test auth itself."""

    def get(self, case: Any, context: Any) -> str:
        return ADMIN_KEY

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error_and_every_response_matches_the_document(
    case: Any, on_each_database: None
) -> None:
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
