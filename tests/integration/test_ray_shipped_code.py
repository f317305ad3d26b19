"""Shipped working directories and the rank environment on the real local Ray (two nodes).

The secrets are planted in the rank actors' own environment through `runtime_env`
`env_vars`, as an external Ray whose raylets were started with the service's variables
would hand them on: what the ranks see must still hold none of them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from gangway.packaging import pack
from scheduler.model import CodeSpec
from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from scheduler.runtime.launch import runtime_env
from tests.integration.test_ray_runtime import poll_until, run_to_end, spec

pytestmark = pytest.mark.ray

SECRETS = {
    "GANGWAY_ADMIN_KEY": "super-secret-admin-key",
    "GANGWAY_DATABASE_URL": "postgresql://gangway:pw@db/gangway",
    "RAY_AUTH_TOKEN": "ray-token",
}


def tiny_wheel(directory: Path) -> Path:
    """A one-module wheel built by hand, so `pip` installs it with no network."""
    path = directory / "tinydep-0.1-py3-none-any.whl"
    files = {
        "tinydep.py": "ANSWER = 'from-the-wheel'\n",
        "tinydep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinydep\nVersion: 0.1\n",
        "tinydep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("tinydep-0.1.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("tinydep-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def shipped_job(tmp_path: Path) -> tuple[str, Path]:
    """A working directory with its own package, a data file read by relative path and a
    script that prints what a rank sees; packed and stored as the service would."""
    work = tmp_path / "work"
    (work / "helper").mkdir(parents=True)
    (work / "helper" / "__init__.py").write_text(
        "import os\n"
        "def leaked():\n"
        "    names = ('GANGWAY_', 'RAY_AUTH_TOKEN')\n"
        "    env = os.environ\n"
        "    return sorted(k for k in env if k.startswith(names) or 'pw@' in env[k])\n"
        "def check(ctx):\n"
        "    assert not leaked(), leaked()\n"
        "    assert os.environ['JOB_FLAG'] == 'on'\n"
        "    print('function rank', ctx.rank, 'clean')\n"
    )
    (work / "data.txt").write_text("payload-from-the-workdir")
    (work / "show.py").write_text(
        "import os, helper\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'],"
        " 'group', os.environ['GROUP_RANK'], open('data.txt').read(),"
        " os.environ['JOB_FLAG'], 'leaked', helper.leaked())\n"
        "assert not helper.leaked()\n"
    )
    package = pack(work)
    root = tmp_path / "packages"
    root.mkdir()
    (root / f"{package.sha256}.zip").write_bytes(package.data)
    return package.sha256, root


def with_code(
    job_id: int,
    nodes: list[str],
    entrypoint: dict[str, Any],
    *,
    sha: str,
    root: Path,
    wheel: Path | None = None,
) -> GroupSpec:
    requirements = ("--no-index", str(wheel)) if wheel else ()
    env = runtime_env(CodeSpec(package=sha, requirements=requirements), root)
    assert env is not None
    env["env_vars"] = SECRETS
    entry = {**entrypoint, "env": {"JOB_FLAG": "on"}, "shipped": True}
    return replace(spec(job_id, nodes, entry), runtime_env=env)


def run_collecting_logs(group_spec: GroupSpec, timeout_s: float = 400) -> tuple[GroupStatus, str]:
    """Run to the end; the final status and every line the ranks printed."""
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            status = group.poll()
            lines += [line for _, _, line in status.logs]
            if status.phase in (GroupPhase.SUCCEEDED, GroupPhase.FAILED):
                return status, "".join(lines)
            time.sleep(0.2)
        raise AssertionError(f"still {group.poll()} after {timeout_s} s")
    finally:
        group.teardown()


@pytest.mark.timeout(600)
def test_shipped_command_script_and_function_run_in_their_directory_on_both_nodes_without_secrets(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    sha, root = shipped_job(tmp_path)
    command = {"kind": "command", "argv": ["python", "show.py"]}
    status, text = run_collecting_logs(with_code(301, gpu_node_ids, command, sha=sha, root=root))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    for rank in (0, 1):
        assert f"rank {rank} of 2 group 0 payload-from-the-workdir on leaked []" in text
    assert "super-secret" not in text and "pw@" not in text

    script = {"kind": "script", "path": "show.py", "args": []}
    status, text = run_collecting_logs(with_code(305, gpu_node_ids, script, sha=sha, root=root))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    for rank in (0, 1):
        assert f"rank {rank} of 2 group 0 payload-from-the-workdir on leaked []" in text

    function = {"kind": "function", "target": "helper:check"}
    status, text = run_collecting_logs(with_code(302, gpu_node_ids, function, sha=sha, root=root))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    assert "function rank 1 clean" in text


@pytest.mark.timeout(600)
def test_builtin_ranks_hold_no_secret(gpu_node_ids: list[str]) -> None:
    """The built-in trainer prints no environment: read each rank actor's own, after it
    ran, with the secrets planted the way an external Ray's raylets would pass them."""
    builtin = {"kind": "builtin", "model": "gpt-tiny", "steps": 2, "batch_size": 2, "env": {}}
    group_spec = replace(spec(306, gpu_node_ids, builtin), runtime_env={"env_vars": SECRETS})
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    try:
        status = poll_until(group, {GroupPhase.SUCCEEDED, GroupPhase.FAILED})
        assert status.phase is GroupPhase.SUCCEEDED, status.error
        calls = [a.__ray_call__.remote(lambda _: dict(os.environ)) for a in group._actors]
        environments = ray.get(calls, timeout=60)
    finally:
        group.teardown()
    assert len(environments) == 2
    for environ in environments:
        assert not [k for k in environ if k.startswith("GANGWAY_") or k in SECRETS]
        assert not [k for k, v in environ.items() if "pw@" in v or "super-secret" in v]
        assert environ["RANK"] in ("0", "1")  # what the rank really ran with


@pytest.mark.timeout(600)
def test_requirements_are_installed_for_the_ranks_on_two_nodes_at_once(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    """Both raylets build the same virtualenv at the same time: each in its own node's
    runtime_env directory (scheduler/runtime/local_ray.py), not in one shared folder."""
    sha, root = shipped_job(tmp_path)
    code = {"sha": sha, "root": root, "wheel": tiny_wheel(tmp_path)}
    command = {"kind": "command", "argv": ["python", "-c", "import tinydep; print(tinydep.ANSWER)"]}
    status, text = run_collecting_logs(with_code(303, gpu_node_ids, command, **code))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    assert text.count("from-the-wheel") == 2


def test_a_job_whose_working_directory_is_missing_fails_saying_so(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    env = runtime_env(CodeSpec(package="f" * 64), tmp_path)
    command = {"kind": "command", "argv": ["true"], "shipped": True}
    base = spec(304, gpu_node_ids[:1], command)
    status = run_to_end(replace(base, runtime_env=env))
    assert status.phase is GroupPhase.FAILED
    assert status.error is not None and "working directory" in status.error
