"""A sandboxed child process of the supervisor and its channels: control in, output and
reports out, and the whole tree stopped on request.

The child's output is pumped into a `LineBuffer` and its reports parsed on a thread each,
so a program that floods either never blocks the supervisor, and a program that stops
reading its stdin never blocks a control message (they are written without waiting).
Stopping: `terminate` sends SIGTERM to every process of the program (not the sandbox's
own init), `kill` SIGKILLs the sandbox's init, and the kernel ends everything in its PID
namespace with it; unsandboxed, the program's process group gets the signals.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workers.channel import MAX_REPORT_BYTES, Report, parse_report, report_socket_pair
from workers.launch import SandboxIdentity
from workers.supervisor import sandbox
from workers.supervisor.cgroups import RankGroup
from workers.supervisor.output import LineBuffer, pump


class ProgramProcess:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        support: sandbox.Support,
        mounts: Sequence[sandbox.Mount],
        cwd: str,
        identity: SandboxIdentity,
        env: Mapping[str, str],
        logs: LineBuffer,
        on_report: Callable[[Report], None] | None = None,
        report_fd_env: Callable[[int], None] | None = None,
        group: RankGroup | None = None,
    ) -> None:
        """Start `argv` in the sandbox, inside the control `group` when there is one.
        `env` is the environment bubblewrap and setpriv start with (nothing of the
        job's); `report_fd_env` is told the number of the report channel's program end
        before the child starts."""
        ours, theirs = report_socket_pair()
        self._reports = ours
        if report_fd_env is not None:
            report_fd_env(theirs.fileno())
        info_read, info_write = os.pipe()
        command = sandbox.command(
            support, argv, mounts=mounts, cwd=cwd, identity=identity, info_fd=info_write
        )
        if group is not None:
            command = group.enter_command(command)
        try:
            self._popen = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(), info_write),
                env=dict(env),
                cwd=None if support.sandboxed else cwd,
                start_new_session=True,
            )
        finally:
            theirs.close()
            os.close(info_write)
        self._init_pid = _sandbox_init(info_read) if support.sandboxed else None
        os.close(info_read)
        assert self._popen.stdout is not None and self._popen.stdin is not None
        self._stdin = self._popen.stdin
        self._stdin_lock = threading.Lock()
        self._output = threading.Thread(
            target=pump, args=(self._popen.stdout.fileno(), logs), daemon=True
        )
        self._output.start()
        self._receiver = threading.Thread(
            target=self._receive, args=(on_report or (lambda _: None),), daemon=True
        )
        self._receiver.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def send(self, message: bytes) -> None:
        """One control line; dropped when the program no longer reads its stdin (a
        script or command that replaced the runner has it closed)."""
        with self._stdin_lock, contextlib.suppress(OSError, ValueError):
            self._stdin.write(message + b"\n")
            self._stdin.flush()

    def wait(self, timeout_s: float | None = None) -> int:
        """The exit code, once the program, its output and its last reports are in."""
        code = self._popen.wait(timeout_s)
        self._output.join(timeout=10)
        self._receiver.join(timeout=10)
        return code

    def poll(self) -> int | None:
        return self._popen.poll()

    def terminate(self) -> None:
        """SIGTERM to every process of the program, as torchrun stops its workers."""
        if self._popen.poll() is not None:
            return
        if self._init_pid is None:
            _signal_group(self._popen.pid, signal.SIGTERM)
            return
        for pid in descendants(self._init_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole tree: the sandbox's PID namespace ends with its init."""
        if self._popen.poll() is None and self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._init_pid, signal.SIGKILL)
        _signal_group(self._popen.pid, signal.SIGKILL)

    def _receive(self, on_report: Callable[[Report], None]) -> None:
        """Parse reports until the program has exited and none is left (a datagram
        socket has no end of its own: its program end may live on in a grandchild)."""
        self._reports.settimeout(0.05)
        try:
            while True:
                try:
                    data = self._reports.recv(MAX_REPORT_BYTES + 1)
                except TimeoutError:
                    if self._popen.poll() is not None:
                        return
                    continue
                report = parse_report(data)
                if report is not None:
                    on_report(report)
        except OSError:
            return
        finally:
            self._reports.close()


def _sandbox_init(info_fd: int) -> int | None:
    """The PID of the sandbox's init, from bubblewrap's `--info-fd` document (None if it
    failed before making one)."""
    data = b""
    while chunk := os.read(info_fd, 4096):
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])
    return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, found from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_text = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat_text.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
