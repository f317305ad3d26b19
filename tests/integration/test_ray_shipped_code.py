"""Shipped working directories, requirements and the rank's directories on the real local
Ray (two nodes): the supervisor unpacks the package and builds the virtualenv on each node,
and the program runs in the sandbox with the directory as its working directory.

What the program cannot see or reach is tested as attacks in tests/security.
"""

from __future__ import annotations

import base64
import hashlib
import io
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gangway.packaging import pack
from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from tests.integration.test_ray_runtime import run_to_end, spec
from workers.launch import CommandRun, FunctionRun, PackageRef, Run, ScriptRun

pytestmark = pytest.mark.ray


def tiny_wheel() -> tuple[str, bytes]:
    """A one-module wheel built by hand, so `pip` installs it with no network."""
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
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("tinydep-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return "tinydep-0.1-py3-none-any.whl", buffer.getvalue()


def shipped_job(tmp_path: Path) -> tuple[PackageRef, Path]:
    """A working directory with its own package, a data file read by relative path, a
    script that prints what a rank sees and a wheel; packed and stored as the service
    would."""
    work = tmp_path / "work"
    (work / "helper").mkdir(parents=True)
    (work / "helper" / "__init__.py").write_text(
        "import os\n"
        "def check(ctx):\n"
        "    assert os.environ['JOB_FLAG'] == 'on'\n"
        "    print('function rank', ctx.rank, 'in', os.getcwd())\n"
    )
    (work / "data.txt").write_text("payload-from-the-workdir")
    (work / "show.py").write_text(
        "import os, helper\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'],"
        " 'group', os.environ['GROUP_RANK'], open('data.txt').read(),"
        " os.environ['JOB_FLAG'])\n"
    )
    name, data = tiny_wheel()
    (work / "wheels").mkdir()
    (work / "wheels" / name).write_bytes(data)
    package = pack(work)
    root = tmp_path / "packages"
    root.mkdir()
    (root / f"{package.sha256}.zip").write_bytes(package.data)
    return PackageRef(sha256=package.sha256), root / f"{package.sha256}.zip"


def with_code(
    job_id: int, nodes: list[str], run: Run, package: tuple[PackageRef, Path], **launch: Any
) -> GroupSpec:
    """The gang with the package's zip handed to Ray's object store, as the service does:
    the nodes never read the folder it is kept in."""
    ref, zip_file = package
    gang = spec(job_id, nodes, run, package=ref, env={"JOB_FLAG": "on"}, **launch)
    return replace(gang, package_file=zip_file)


def run_collecting_logs(group_spec: GroupSpec, timeout_s: float = 400) -> tuple[GroupStatus, str]:
    """Run to the end; the final status and every line the ranks printed."""
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            status = group.poll()
            lines += [line + "\n" for _, _, line in status.logs]
            if status.phase in (GroupPhase.SUCCEEDED, GroupPhase.FAILED):
                return status, "".join(lines)
            time.sleep(0.2)
        raise AssertionError(f"still {group.poll()} after {timeout_s} s")
    finally:
        group.teardown()


@pytest.mark.timeout(600)
def test_shipped_command_script_and_function_run_in_their_directory_on_both_nodes(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    package = shipped_job(tmp_path)
    command = CommandRun(argv=["python", "show.py"])
    status, text = run_collecting_logs(with_code(301, gpu_node_ids, command, package))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    for rank in (0, 1):
        assert f"rank {rank} of 2 group 0 payload-from-the-workdir on" in text

    script = ScriptRun(path="show.py")
    status, text = run_collecting_logs(with_code(305, gpu_node_ids, script, package))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    for rank in (0, 1):
        assert f"rank {rank} of 2 group 0 payload-from-the-workdir on" in text

    function = FunctionRun(target="helper:check")
    status, text = run_collecting_logs(with_code(302, gpu_node_ids, function, package))
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    assert "function rank 1 in /gangway/work" in text


@pytest.mark.timeout(600)
def test_requirements_are_installed_for_the_ranks_on_two_nodes_at_once(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    """Both nodes build the virtualenv at the same time, each its own, in the sandbox (pip
    runs the job's build code), from a wheel in the working directory (no index)."""
    package = shipped_job(tmp_path)
    command = CommandRun(argv=["python", "-c", "import tinydep; print(tinydep.ANSWER)"])
    requirements = ["--no-index", "--find-links wheels", "tinydep"]
    group_spec = with_code(303, gpu_node_ids, command, package, requirements=requirements)
    status, text = run_collecting_logs(group_spec)
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    assert text.count("from-the-wheel") == 2


def test_a_job_whose_working_directory_is_missing_fails_saying_so(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    missing = (PackageRef(sha256="f" * 64), tmp_path / f"{'f' * 64}.zip")
    status = run_to_end(with_code(304, gpu_node_ids[:1], CommandRun(argv=["true"]), missing))
    assert status.phase is GroupPhase.FAILED
    assert status.error is not None and "working directory" in status.error
    # a zip that is not the one named: each node checks what it fetched
    wrong = tmp_path / "wrong.zip"
    wrong.write_bytes(b"PK not the named package")
    forged = (PackageRef(sha256="e" * 64), wrong)
    status = run_to_end(with_code(306, gpu_node_ids[:1], CommandRun(argv=["true"]), forged))
    assert status.phase is GroupPhase.FAILED
    assert status.error is not None and "does not hash to its name" in status.error
