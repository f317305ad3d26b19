"""Stop the embedded Ray when the service dies, however it dies.

`Runtime.stop` shuts the embedded Ray down on a clean stop, but a service killed with
SIGKILL runs no code: its Ray (GCS, raylets, their agents and workers) would keep running,
holding ~700 MB, until someone notices. So the service starts this small process beside
its Ray: it waits for the service's pid to go, then kills every process of that Ray
session, found by the session directory on its command line (GCS, raylets, monitors) and
every descendant of those (agents and workers, whose titles Ray rewrites).

Linux only (it reads /proc), like the embedded Ray's process layout it knows.

    python -m scheduler.runtime.ray_watchdog SERVICE_PID SESSION_DIR
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

_PROC = Path("/proc")


def session_processes(session_dir: str) -> set[int]:
    """Pids of the Ray session's live processes and all their descendants (not this
    one); zombies (exited, not yet reaped) are not counted."""
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z":  # exited already, waiting to be reaped by its parent
            continue
        parents[pid] = int(parent)
        if session_dir in cmdline and "ray_watchdog" not in cmdline:
            roots.add(pid)
    found = set(roots)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grew = bool(children)
    found.discard(os.getpid())
    return found


def kill_session(session_dir: str) -> int:
    """SIGKILL every process of the session; how many there were."""
    pids = session_processes(session_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(service_pid: int, session_dir: str, poll_s: float = 0.5) -> None:
    while _alive(service_pid):
        time.sleep(poll_s)
    kill_session(session_dir)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
