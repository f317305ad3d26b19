"""Stop the embedded Ray when the service dies, however it dies.

`Runtime.stop` shuts the embedded Ray down on a clean stop, but a service killed with
SIGKILL runs no code. Ray's own processes (GCS, raylets) share the service's fate, yet the
agents each raylet starts (dashboard agent, runtime-env agent: ~700 MB on two nodes) are
re-parented and keep running. So the service starts this small process beside its Ray:
while the service lives it keeps the list of that Ray session's processes (those with the
session directory on their command line and all their descendants, whose titles Ray
rewrites); once the service's pid is gone it kills every one of them still running.
A pid is only killed if it is still the process that was seen (same start time).

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


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None once it is gone."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def session_processes(session_dir: str) -> dict[int, int]:
    """The Ray session's live processes and all their descendants (not this one), each
    with its start time; zombies (exited, not yet reaped) are left out."""
    if not Path(session_dir).name.startswith("session_"):
        raise ValueError(f"not a Ray session directory: {session_dir!r}")
    parents: dict[int, int] = {}
    started: dict[int, int] = {}
    roots: set[int] = set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat is None or stat[0] == "Z":
            continue
        parents[pid], started[pid] = stat[1], stat[2]
        if session_dir in cmdline and "ray_watchdog" not in cmdline:
            roots.add(pid)
    found = set(roots)
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grew = bool(children)
    found.discard(os.getpid())
    return {pid: started[pid] for pid in found}


def kill_seen(seen: dict[int, int]) -> int:
    """SIGKILL every process in `seen` still running as the same process; how many."""
    killed = 0
    for pid, start in seen.items():
        stat = _stat(pid)
        if stat is None or stat[0] == "Z" or stat[2] != start:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def watch(service_pid: int, session_dir: str, poll_s: float = 1.0) -> None:
    seen: dict[int, int] = {}
    while _alive(service_pid):
        seen.update(session_processes(session_dir))
        time.sleep(poll_s)
    seen.update(session_processes(session_dir))
    kill_seen(seen)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
