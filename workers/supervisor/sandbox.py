"""The sandbox a rank program runs in: bubblewrap namespaces, an unprivileged identity, a
filesystem view of only what the rank needs.

Three kinds, by what the host allows (`detect`):

- `bwrap-uid` (the supervisor runs as root): bubblewrap builds new PID, IPC, UTS and mount
  namespaces as root, then `setpriv` drops to the job's uid and gid with no capabilities,
  no supplementary groups and no new privileges. File permissions hold against the
  service: the program is not its user.
- `bwrap-userns` (not root, unprivileged user namespaces allowed): the same namespaces
  inside a user namespace; the program keeps the service's uid, so only the mount
  namespace keeps it from the service's files (nothing of the service's is mounted).
- `none`: a plain child process in a session of its own. No isolation; the service
  refuses auth-on multi-user mode on such a host unless the admin opts in.

Either bubblewrap kind sees: its own processes only (/proc is the new namespace's), a
fresh /dev (plus the GPUs), /usr and the interpreter read-only, a few files of /etc, and
the rank's mounts (`Mount`): the working directory and venvs read-only; the checkpoint,
outputs, tmp and shared-memory directories writable. The network is the host's: ranks
talk to each other over it; Ray's ports refuse anyone without its token.

bubblewrap and setpriv run with a clean environment: a job's variables (LD_PRELOAD, say)
reach only the program, after the drop (`workers.program.runner` applies them).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from workers.launch import SandboxIdentity

Kind = Literal["bwrap-uid", "bwrap-userns", "none"]

# Of /etc, what programs, Python, pip and the C library read: names, users, DNS, TLS roots.
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "resolv.conf",
    "gai.conf",
    "localtime",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "alternatives",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "debian_version",
    "lsb-release",
)
GPU_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


@dataclass(frozen=True)
class Support:
    """What this host can do, and why not when it cannot."""

    kind: Kind
    detail: str

    @property
    def sandboxed(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    writable: bool = False


@functools.cache
def detect() -> Support:
    """Probe once per process: is bubblewrap here, and can it make namespaces?"""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Support("none", "bubblewrap (bwrap) is not installed")
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        return Support("none", "setpriv (util-linux) is not installed")
    probe = [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env={}, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support("none", f"bubblewrap does not run: {exc}")
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        return Support("none", f"bubblewrap cannot make namespaces here: {why}")
    if root:
        return Support("bwrap-uid", "bubblewrap namespaces, an unprivileged uid per job")
    return Support("bwrap-userns", "bubblewrap namespaces in a user namespace, same uid")


def command(
    support: Support,
    argv: Sequence[str],
    *,
    mounts: Iterable[Mount],
    cwd: str,
    identity: SandboxIdentity,
    info_fd: int | None = None,
) -> list[str]:
    """The command line that runs `argv` in the sandbox `support` allows (as is for
    `none`: the caller then runs it in `cwd` itself)."""
    if not support.sandboxed:
        return list(argv)
    args = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *_system_binds(),
        *_binds([*python_mounts(), *mounts]),
        "--chdir",
        cwd,
    ]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    args.append("--")
    if support.kind == "bwrap-uid":
        args += [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
    return [*args, *argv]


def _system_binds() -> list[str]:
    """/usr read-only, the top-level links into it as the host has them, /sys read-only
    (CPU and PCI topology for torch and NCCL), a few files of /etc, the GPUs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind-try", "/sys", "/sys", "--perms", "0755", "--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for device in sorted(Path("/dev").glob("nvidia[0-9]*")) + [
        Path("/dev") / name for name in GPU_DEVICES
    ]:
        args += ["--dev-bind-try", str(device), str(device)]
    return args


def python_mounts() -> list[Mount]:
    """The interpreter and the training stack, read-only at their own paths: the base
    installation, the virtualenv, and Gangway's `workers` and `gangway` packages when
    they live outside it (an editable install). Never the rest of the checkout: the
    service's code and data stay out of sight."""
    import gangway
    import workers

    prefixes = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
    packages = {Path(p.__file__ or "").parent for p in (gangway, workers)}
    roots = sorted(prefixes | packages)
    kept = [r for r in roots if not any(r != o and r.is_relative_to(o) for o in roots)]
    return [Mount(root, str(root)) for root in kept if str(root) != "/usr"]


def _binds(mounts: Iterable[Mount]) -> list[str]:
    """bubblewrap's arguments for the mounts, parents first. The folders above a mount
    that nothing else provides are made world-readable (bubblewrap would copy the host's
    modes, and a 0700 /root would hide the interpreter from the program's uid)."""
    args: list[str] = []
    made: set[PurePosixPath] = {PurePosixPath("/")}
    ordered = sorted(mounts, key=lambda m: (len(PurePosixPath(m.target).parts), m.target))
    for mount in ordered:
        target = PurePosixPath(mount.target)
        for parent in reversed(target.parents):
            if parent not in made and not _under_system(parent):
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        args += ["--bind" if mount.writable else "--ro-bind", str(mount.source), str(target)]
        made.add(target)
    return args


def _under_system(path: PurePosixPath) -> bool:
    return path.parts[1:2] in (("usr",), ("proc",), ("dev",), ("sys",), ("etc",))
