"""Attack: another user (or a service, or a proxy in front of it) puts terminal escape
sequences in text the CLI prints: a job name, a failure, a log line, a reason. Printed as
they are, they retitle the window (OSC), clear the screen (CSI), recolour or hide what
follows, and carriage returns overwrite a line. The CLI prints every such text with them
removed; `--json` escapes them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import gangway.cli
import gangway.cli_shared
from gangway import Client
from scheduler.model import JobState
from scheduler.store import JobRepository
from tests.integration.test_cli import submit

# Window title (OSC up to BEL, and up to ST), clear screen (CSI), 8-bit CSI, overwrite.
PAYLOAD = "\x1b]0;pwned\x07\x1b]2;again\x1b\\\x1b[2J\x9b31m\rfake"
FORBIDDEN = ("\x1b", "\x9b", "\x07", "\r")


def printed(cli: CliRunner, *args: str, exit_code: int = 0) -> str:
    """stdout and stderr of one command, checked to hold none of the forbidden characters."""
    result = cli.invoke(gangway.cli.app, list(args))
    assert result.exit_code == exit_code, result.output
    shown = result.output  # stdout and stderr, as a terminal shows them
    for char in FORBIDDEN:
        assert char not in shown, f"gangway {' '.join(args)} printed {char!r}: {shown!r}"
    return shown


def fail(repo: JobRepository, job_id: int, error: str) -> None:
    """What the scheduler loop writes when a rank fails with `error`."""
    placement: dict[str, Any] = {"placement": ["id-1", "id-1"]}
    for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
        repo.transition(job_id, state, reason=f"moved {PAYLOAD}", **placement)
        placement = {}
    repo.transition(job_id, JobState.FAILED, reason=f"rank 0 failed {PAYLOAD}", error=error)


def test_a_hostile_job_cannot_drive_the_terminal_of_whoever_lists_it(
    cli: CliRunner, repo: JobRepository
) -> None:
    failed = submit(cli, f"train{PAYLOAD}")
    repo.append_logs(failed, 1, [(0, 1, f"step 1 {PAYLOAD}"), (0, 2, f"{PAYLOAD}\tdone")])
    fail(repo, failed, f"Traceback ...\nRuntimeError: {PAYLOAD}")
    waiting = submit(cli, f"wait{PAYLOAD}")
    why = {
        "blocker": f"cluster_full{PAYLOAD}",
        "message": f"needs 2 GPUs{PAYLOAD}",
        "unblock": f"when job 9 ends{PAYLOAD}",
        "queue_position": 1,
    }
    repo.explain_wait(waiting, f"waiting {PAYLOAD}", explanation=why)

    assert "trainfake" in printed(cli, "jobs")  # the text stays, minus its controls
    assert "RuntimeError: ]0;pwned" not in printed(cli, "status", str(failed))
    printed(cli, "events", str(failed))
    assert "\tdone" in printed(cli, "logs", str(failed))  # tabs and newlines stay
    printed(cli, "logs", str(failed), "-f")
    printed(cli, "explain", str(waiting))
    printed(cli, "queue")
    printed(cli, "cancel", str(waiting))
    for args in (["jobs"], ["status", str(failed)], ["events", str(failed)], ["queue"]):
        as_json = printed(cli, *args, "--json")  # JSON escapes them, and still parses
        json.loads(as_json)
    lines = printed(cli, "logs", str(failed), "-f", "--json").splitlines()
    assert json.loads(lines[0])["line"] == f"step 1 {PAYLOAD}"  # escaped, never lost


def hostile_service(request: httpx.Request) -> httpx.Response:
    """A service (or a proxy in front of it) whose answers carry escape sequences."""
    path = request.url.path
    if path == "/v1/whoami":
        return httpx.Response(200, json={"name": PAYLOAD, "role": "admin", "auth_enabled": False})
    if path == "/v1/users":
        return httpx.Response(
            200, json=[{"name": PAYLOAD, "role": "user", "created_at": "2026-01-01T00:00:00Z"}]
        )
    if path == "/v1/queues":
        counts = dict.fromkeys(
            ("gpus_in_use", "gpus_borrowed", "jobs_pending", "jobs_holding_gpus"), 0
        )
        queue = {"name": PAYLOAD, "guaranteed_gpus": 1, "borrow_limit_gpus": None, "weight": 1.0}
        return httpx.Response(200, json=[{**queue, **counts}])
    error = {"code": "not_found", "message": f"no such job {PAYLOAD}", "field": PAYLOAD}
    return httpx.Response(404, json={"error": error, "errors": [error]})


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (["whoami"], 0),
        (["users", "list"], 0),
        (["queues"], 0),
        (["status", "1"], 1),  # the error message, built from the service's answer
        (["events", "1"], 1),
    ],
)
def test_a_hostile_service_cannot_drive_the_terminal(
    monkeypatch: pytest.MonkeyPatch, args: list[str], exit_code: int
) -> None:
    def connect(url: str) -> Client:
        return Client(url, transport=httpx.MockTransport(hostile_service))

    monkeypatch.setattr(gangway.cli_shared, "connect", connect)
    assert "fake" in printed(CliRunner(), *args, exit_code=exit_code)
