"""A control group per rank program, where the host lets the supervisor make one: a bound
on its processes (a fork bomb stays inside its own rank, whatever uid it shares with other
jobs) and, when the admin sets one, on its memory (the kernel's OOM killer ends the rank,
not the node).

cgroup v2 (one hierarchy: `pids` and `memory` enabled for Gangway's subtree) or v1 (the
`pids` and `memory` hierarchies), both as root. The program is placed by the command that
starts it (`enter_command`): a shell writes its own pid into the group and then execs the
sandbox, so bubblewrap and everything it starts are inside from their first instruction.
Without cgroups (not root, a read-only /sys/fs/cgroup) the rank falls back to RLIMIT_NPROC
and RLIMIT_AS, which `workers.program.runner` applies.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "gangway"
STALE_AFTER_S = 60.0


@dataclass(frozen=True)
class RankGroup:
    """One rank program's group in each hierarchy the host has."""

    leaves: tuple[Path, ...]
    version: int

    def enter_command(self, argv: list[str]) -> list[str]:
        """`argv`, started from inside the group."""
        writes = "; ".join(f'echo $$ > "{leaf}/cgroup.procs"' for leaf in self.leaves)
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "gangway-enter", *argv]

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the group for its memory limit."""
        for leaf in self.leaves:
            events = leaf / "memory.events"
            if events.is_file():
                counts = dict(line.split() for line in events.read_text().splitlines())
                return int(counts.get("oom_kill", "0")) > 0
            control = leaf / "memory.oom_control"
            if control.is_file():
                counts = dict(line.split() for line in control.read_text().splitlines())
                return int(counts.get("oom_kill", "0")) > 0
        return False

    def remove(self) -> None:
        """Remove the group once its processes are gone (the sandbox's PID namespace ends
        with its init, so none is left after the program's exit)."""
        for leaf in self.leaves:
            with contextlib.suppress(OSError):
                leaf.rmdir()


def rank_group(name: str, *, pids_max: int | None, memory_bytes: int | None) -> RankGroup | None:
    """A fresh group `name` under Gangway's, with the limits set; None where the host has
    no cgroup this process may make."""
    if os.geteuid() != 0:
        return None
    try:
        if (ROOT / "cgroup.controllers").is_file():
            return _v2(name, pids_max, memory_bytes)
        return _v1(name, pids_max, memory_bytes)
    except OSError:
        return None


def _v2(name: str, pids_max: int | None, memory_bytes: int | None) -> RankGroup:
    parent = ROOT / GROUP
    parent.mkdir(exist_ok=True)
    (parent / "cgroup.subtree_control").write_text("+pids +memory")
    leaf = _fresh(parent / name)
    if pids_max is not None:
        (leaf / "pids.max").write_text(str(pids_max))
    if memory_bytes is not None:
        (leaf / "memory.max").write_text(str(memory_bytes))
    return RankGroup((leaf,), 2)


def _v1(name: str, pids_max: int | None, memory_bytes: int | None) -> RankGroup:
    """Under this process's own group in each hierarchy, so what the host (or a container)
    counts and bounds for the supervisor it still counts for its programs."""
    own = _own_v1_groups()
    leaves = []
    if pids_max is not None:
        leaf = _fresh(ROOT / "pids" / own.get("pids", "") / GROUP / name)
        (leaf / "pids.max").write_text(str(pids_max))
        leaves.append(leaf)
    if memory_bytes is not None:
        leaf = _fresh(ROOT / "memory" / own.get("memory", "") / GROUP / name)
        (leaf / "memory.limit_in_bytes").write_text(str(memory_bytes))
        leaves.append(leaf)
    if not leaves:
        raise OSError("no limit to set")
    return RankGroup(tuple(leaves), 1)


def _own_v1_groups() -> dict[str, str]:
    """controller -> this process's group in it (relative), from /proc/self/cgroup."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            groups[controller] = path.lstrip("/")
    return groups


def _fresh(leaf: Path) -> Path:
    """The leaf, made anew. Leaves that supervisors killed by Ray left behind are removed
    once they are a minute old and empty (a live rank's is not empty: rmdir refuses)."""
    leaf.parent.mkdir(parents=True, exist_ok=True)
    stale_before = time.time() - STALE_AFTER_S
    for sibling in leaf.parent.iterdir():
        if sibling.is_dir() and (sibling == leaf or sibling.stat().st_mtime < stale_before):
            with contextlib.suppress(OSError):
                sibling.rmdir()
    leaf.mkdir()
    return leaf
