"""The sandbox on this host, without Ray: a program started through `ProgramProcess` sees
only its own processes and files, runs as the job's uid, cannot keep its children alive
past a kill, and is told to stop by SIGTERM (scripts and commands). Needs bubblewrap
(scripts/test installs it); under CI a host without it is a failure, not a skip."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from workers.launch import SandboxIdentity
from workers.supervisor import sandbox
from workers.supervisor.cgroups import rank_group
from workers.supervisor.output import LineBuffer
from workers.supervisor.process import ProgramProcess, descendants
from workers.supervisor.workspace import input_mounts

SUPPORT = sandbox.detect()
if not SUPPORT.sandboxed:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs the rank sandbox: {SUPPORT.detail}", pytrace=False)
    pytest.skip(f"no sandbox on this host: {SUPPORT.detail}", allow_module_level=True)

NOBODY = SandboxIdentity(uid=65534, gid=65534)
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}


def start(shell: str, tmp_path: Path, *mounts: sandbox.Mount) -> tuple[ProgramProcess, LineBuffer]:
    logs = LineBuffer()
    scratch = tmp_path / "tmp"
    scratch.mkdir(mode=0o777, exist_ok=True)
    scratch.chmod(0o777)
    program = ProgramProcess(
        ["sh", "-c", shell],
        support=SUPPORT,
        mounts=[sandbox.Mount(scratch, "/tmp", writable=True), *mounts],
        cwd="/tmp",
        identity=NOBODY,
        env=ENV,
        logs=logs,
    )
    return program, logs


def output(program: ProgramProcess, logs: LineBuffer) -> tuple[int, list[str]]:
    code = program.wait(30)
    return code, [line for _, line in logs.since(0)]


def test_the_program_sees_only_its_own_processes_and_mounts(tmp_path: Path) -> None:
    secret = tmp_path / "service-secret"
    secret.write_text("admin key")
    program, logs = start(
        f"ls /proc | grep -c '^[0-9]'; cat {secret} 2>&1; ls /; touch /usr/x 2>&1; id -u",
        tmp_path,
    )
    code, lines = output(program, logs)
    assert code == 0, lines
    assert int(lines[0]) <= 4  # init, sh, ls, grep
    assert "No such file or directory" in lines[1]
    host_only = {"home", "var", "opt", "srv", "mnt", "media", "boot", "gangway"}
    assert host_only.isdisjoint(lines)  # /root holds only the interpreter, if it lives there
    assert any("Read-only file system" in line for line in lines)
    if SUPPORT.kind == "bwrap-uid":
        assert lines[-1] == "65534"


def test_sigterm_reaches_the_program_and_a_kill_leaves_no_process(tmp_path: Path) -> None:
    program, logs = start("trap 'echo got TERM; exit 7' TERM; sleep 300 & wait", tmp_path)
    time.sleep(0.5)
    program.terminate()
    code, lines = output(program, logs)
    assert lines == ["got TERM"] and code == 7

    program, logs = start("sleep 300 & sleep 300 & setsid sleep 300 & wait", tmp_path)
    time.sleep(0.5)
    assert len(descendants(program.pid)) >= 4
    program.kill()
    program.wait(30)
    time.sleep(0.3)
    assert descendants(program.pid) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_our_sleep(int(p))]


def test_a_writable_mount_is_the_only_way_out(tmp_path: Path) -> None:
    shared = tmp_path / "outputs"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    program, logs = start(
        "echo kept > /gangway/outputs/a.txt; echo lost > /gangway/b.txt 2>&1; echo done",
        tmp_path,
        sandbox.Mount(shared, "/gangway/outputs", writable=True),
    )
    code, _lines = output(program, logs)
    assert code == 0
    assert (shared / "a.txt").read_text() == "kept\n"
    assert not (tmp_path / "b.txt").exists()


def _is_our_sleep(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        owner = Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return False
    return cmdline == b"sleep\x00300\x00" and owner == NOBODY.uid


def test_a_fork_bomb_stays_inside_its_rank_and_memory_past_the_limit_ends_it(
    tmp_path: Path,
) -> None:
    """The rank's control group bounds its processes (whatever uid other jobs share with
    it) and its memory; where this host has no cgroup a supervisor can make, the rank
    falls back to RLIMIT_NPROC and RLIMIT_AS (not tested here)."""
    group = rank_group(f"test-{os.getpid()}-bomb", pids_max=24, memory_bytes=None)
    if group is None:
        pytest.skip("no writable cgroup on this host")
    logs = LineBuffer()
    scratch = tmp_path / "tmp"
    scratch.mkdir(mode=0o777)
    scratch.chmod(0o777)
    bomb = "n=0; while [ $n -lt 500 ]; do sleep 30 & n=$((n+1)); done; echo made; wait"
    program = ProgramProcess(
        ["sh", "-c", bomb],
        support=SUPPORT,
        mounts=[sandbox.Mount(scratch, "/tmp", writable=True)],
        cwd="/tmp",
        identity=NOBODY,
        env=ENV,
        logs=logs,
        group=group,
    )
    program.wait(60)  # the shell gives up ("Cannot fork") at the group's limit
    (leaf,) = group.leaves
    events = dict(line.split() for line in (leaf / "pids.events").read_text().splitlines())
    assert int(events["max"]) > 0  # forks were refused at the limit
    assert not any("made" in line for _, line in logs.since(0))
    group.remove()

    hog = rank_group(f"test-{os.getpid()}-hog", pids_max=None, memory_bytes=64 << 20)
    assert hog is not None
    program = ProgramProcess(
        ["python3", "-c", "x = b'1' * (256 << 20); print('survived')"],
        support=SUPPORT,
        mounts=[],
        cwd="/",
        identity=NOBODY,
        env=ENV,
        logs=LineBuffer(),
        group=hog,
    )
    assert program.wait(60) != 0
    assert hog.out_of_memory()
    hog.remove()


def test_the_outputs_a_job_reads_are_there_read_only(tmp_path: Path) -> None:
    """`inputs_from`: each job's outputs under INPUTS_DIR/job-<id>, readable as the job's
    uid, not writable; a job that wrote nothing is an empty folder."""
    wrote = tmp_path / "outputs" / "job-1" / "rank-0"
    wrote.mkdir(parents=True)
    (wrote / "a.txt").write_text("from job 1")
    (wrote / "a.txt").chmod(0o644)
    inputs = {"job-1": str(wrote.parent), "job-2": str(tmp_path / "outputs" / "job-2")}
    mounts = input_mounts(tmp_path / "rank" / "inputs", inputs, sandboxed=True)
    program, logs = start(
        "cat /gangway/inputs/job-1/rank-0/a.txt; echo; ls /gangway/inputs; "
        "ls /gangway/inputs/job-2 | wc -l; touch /gangway/inputs/job-1/x 2>&1 || echo refused",
        tmp_path,
        *mounts,
    )
    code, lines = output(program, logs)
    assert code == 0, lines
    assert lines[:4] == ["from job 1", "job-1", "job-2", "0"]  # job 2 wrote nothing
    assert lines[-1] == "refused" and not (wrote.parent / "x").exists()
    # unsandboxed: links to the folders that exist
    linked = input_mounts(tmp_path / "plain" / "inputs", inputs, sandboxed=False)
    assert linked == []
    assert (
        tmp_path / "plain" / "inputs" / "job-1" / "rank-0" / "a.txt"
    ).read_text() == "from job 1"
    assert (tmp_path / "plain" / "inputs" / "job-2").is_dir()
