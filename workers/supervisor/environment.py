"""Environments built from allow-lists, never inherited whole.

The service holds secrets in its environment (`GANGWAY_ADMIN_KEY`, the database URL) and
Ray's processes hold Ray's token; jobs are untrusted code (DESIGN principles 15 and 17).
Two filters:

- `scrubbed`: what Ray's own processes (the embedded Ray's GCS and raylets) start with:
  what a program, torch, CUDA and Ray read, no `GANGWAY_*` secret. They are Gangway's
  control plane, so the caller adds Ray's token settings itself.
- `program_environment`: what a rank program starts with: the host's locale, CUDA,
  NCCL, gloo and torch settings (Ray sets `CUDA_VISIBLE_DEVICES` and `OMP_NUM_THREADS`
  for the actor), then the paths the sandbox gives it, then the job's own variables, then
  what Gangway must decide (its rank, its report channel). Nothing of Ray's: a rank is not
  a Ray worker and cannot talk to the cluster.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# Exact names a program, a shell, Python and the C libraries read.
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "HOSTNAME",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
# Families that torch, CUDA, NCCL/gloo and Ray's worker processes configure themselves by.
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_", "RAY_")
# Inside those families, what still must not pass on: a Ray token lets its holder submit
# work to the cluster around Gangway; Ray's own processes get it from their starter.
DENIED_NAMES = frozenset({"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"})
# What a rank program takes from the host: no paths of the host's (the sandbox has its
# own), nothing of Ray's.
PROGRAM_NAMES = frozenset({"LANG", "LANGUAGE", "TZ", "TERM", "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
PROGRAM_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_")


def is_allowed(name: str) -> bool:
    if name in DENIED_NAMES:
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def scrubbed(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of `environ`."""
    return {name: value for name, value in environ.items() if is_allowed(name)}


def program_environment(
    host: Mapping[str, str],
    *,
    sandbox: Mapping[str, str],
    job: Mapping[str, str],
    rank: Mapping[str, str],
) -> dict[str, str]:
    """A rank program's whole environment, in order of precedence (later wins): the
    allow-listed part of the `host`'s, the `sandbox`'s paths (PATH, HOME, TMPDIR, the
    interpreter), the `job`'s own variables and secrets, and the `rank`'s (RANK and the
    other torchrun variables, the report channel), which the job cannot override."""
    inherited = {
        name: value
        for name, value in host.items()
        if name in PROGRAM_NAMES or name.startswith(PROGRAM_PREFIXES)
    }
    return {**inherited, **sandbox, **job, **rank}


def network_env(address: str, host: Mapping[str, str]) -> dict[str, str]:
    """Which interface the ranks' collectives use, where the node's own environment
    (`host`) does not say: the one holding this node's address (Ray's node IP). Gloo and
    NCCL otherwise take the address the host name resolves to, often a loopback one that
    no other host can reach. Empty when no interface has it as its primary IPv4 address
    (a secondary or IPv6-only address: set the variables on the node). A job's own
    variables override these."""
    for _, name in socket.if_nameindex():
        if _ipv4_address(name) == address:
            chosen = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": f"={name}"}  # exact
            return {key: value for key, value in chosen.items() if key not in host}
    return {}


def _ipv4_address(interface: str) -> str | None:
    """The interface's (primary) IPv4 address, as Linux's SIOCGIFADDR reports it."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), siocgifaddr, struct.pack("256s", interface[:15].encode())
            )
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


@contextmanager
def scrubbed_process(extra: Mapping[str, str] | None = None) -> Iterator[None]:
    """Run the block with only the allow-listed environment plus `extra`, then restore
    it: child processes started inside it (the embedded Ray's GCS and raylets) inherit no
    secret of the service's."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({**scrubbed(saved), **(extra or {})})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
