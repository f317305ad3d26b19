"""A function target names a module and an attribute path in it; the policy must judge
the module the final object lives in, not the one before the colon. Found by the audit:
`workers.examples:torch.save` passed the default policy because workers/examples.py
imports torch."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.security.audit_api import BUILTIN, audited, refusal, users


def _function(target: str) -> dict[str, object]:
    return {**BUILTIN, "entrypoint": {"kind": "function", "target": target}}


@pytest.mark.parametrize(
    ("target", "home"),
    [
        ("workers.examples:torch.save", "torch.serialization"),
        ("workers.examples:dist.barrier", "torch.distributed"),
        ("workers.examples:Path", "pathlib"),
        ("workers.examples:faults.inject", "workers.faults"),
        ("workers.examples:time.sleep", "time"),
    ],
)
def test_bob_cannot_reach_a_module_through_an_allowed_ones_imports(
    database_url: str, tmp_path: Path, target: str, home: str
) -> None:
    api = audited(database_url, tmp_path)
    _, bob = users(api)
    answer = api.post("/v1/jobs", json=_function(target), headers=bob)
    assert refusal(answer) == (403, "entrypoint.target"), answer.text
    assert repr(home) in answer.json()["error"]["message"]
    example = api.post("/v1/jobs", json=_function("workers.examples:check_mesh"), headers=bob)
    assert example.status_code == 201, example.text


def _allowed_package(root: Path) -> str:
    """An admin-allowed package whose modules re-export things from elsewhere."""
    name = f"allowed_{uuid.uuid4().hex[:8]}"
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "helpers.py").write_text("def helper(ctx):\n    pass\n")
    (root / name / "tools.py").write_text(
        "import subprocess\n"
        "from os import system as run\n"
        "from .helpers import helper\n"
        "launch = subprocess.Popen\n"
        "class Trainer:\n"
        "    def fit(self, ctx):\n"
        "        pass\n"
        "class Shell(subprocess.Popen):\n"
        "    pass\n"
    )
    return name


@pytest.mark.parametrize(
    ("attribute", "home"),
    [
        ("run", "'os'"),  # from os import system as run
        ("launch", "'subprocess'"),  # an alias assigned at top level
        ("subprocess.run", "'subprocess'"),
        ("Shell.communicate", "Shell"),  # inherited from subprocess.Popen: not the class's own
    ],
)
def test_an_allowed_module_does_not_lend_its_imports(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attribute: str, home: str
) -> None:
    package = _allowed_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    api = audited(database_url, tmp_path, function_modules=[package])
    _, bob = users(api)
    answer = api.post("/v1/jobs", json=_function(f"{package}.tools:{attribute}"), headers=bob)
    assert refusal(answer) == (403, "entrypoint.target"), answer.text
    assert home in answer.json()["error"]["message"]


def test_what_allowed_modules_define_still_runs(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an attack: the guard that the fix does not refuse too much."""
    package = _allowed_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    api = audited(database_url, tmp_path, function_modules=[package])
    _, bob = users(api)
    for attribute in ("Trainer.fit", "helper"):  # a method of its class; another module's
        target = f"{package}.tools:{attribute}"
        answer = api.post("/v1/jobs", json=_function(target), headers=bob)
        assert answer.status_code == 201, answer.text
