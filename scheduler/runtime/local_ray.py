"""Start the embedded local Ray: a head without resources plus N logical GPU nodes, as
Gangway's private control plane.

Ray's `cluster_utils.Cluster` starts real raylets on this machine, each advertising
`num_gpus` logical GPUs, so gang placement across nodes is exercised exactly as on a real
cluster; on a CPU machine the ranks use gloo.

Private means:
- every Ray process listens on 127.0.0.1 only (the nodes' address, and Ray told to keep
  loopback addresses as they are: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`), so no Ray port
  is reachable from another machine;
- token auth is on, with a token of this service's in its Ray directory (mode 0600);
  ranks never see it: they are not Ray workers and get no `RAY_*` variable;
- its session files, its address file and its token live in the service's own Ray
  directory (`ray_directory`), never /tmp/ray, so it neither finds nor overwrites another
  Ray of this host's ("Overwriting previous Ray address");
- its processes start with the allow-listed environment only: raylets hand theirs to
  every worker, and the service's holds secrets.

All its raylets share the head's session directory, and by default Ray keeps each node's
runtime_env cache in that session's `runtime_resources`: each node gets a directory of
its own (RayParams `runtime_env_dir_name`), as on separate hosts.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scheduler.runtime.cluster import NODE_NAME_LABEL
from workers.supervisor.environment import scrubbed_process

LOOPBACK = "127.0.0.1"
# Ray's socket paths (`<dir>/ray/session_<time>_<pid>/sockets/plasma_store`) must fit in
# the 107 bytes of a Unix socket address; a longer data directory gets a short private one.
_MAX_RAY_DIR = 36


@dataclass(frozen=True)
class LocalClusterShape:
    num_nodes: int = 2
    gpus_per_node: int = 4
    cpus_per_node: int = 8


def ray_directory(data_dir: Path) -> Path:
    """The embedded Ray's own directory: `<data_dir>/ray`, or, when that path is too long
    for Ray's sockets, a private folder named after the data directory in the system's
    tmp (mode 0700, refused if another user owns it or may write it). It holds the token
    and Ray's temp dir (`ray/`, sessions and the address file), which Ray makes
    world-writable: this folder's mode is what keeps others out."""
    data_dir = data_dir.expanduser().resolve()
    preferred = data_dir / "ray"
    if len(str(preferred)) <= _MAX_RAY_DIR:
        preferred.mkdir(mode=0o700, parents=True, exist_ok=True)
        return preferred
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"gangway-{os.getuid()}-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    info = short.lstat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{short} is not this service's private folder; remove it")
    return short


def private_ray_environment(directory: Path) -> dict[str, str]:
    """The variables that make this process and the Ray it starts private (see the module
    docstring), with a token made once per directory."""
    (directory / "ray").mkdir(mode=0o700, exist_ok=True)  # Ray's temp dir, as RAY_TMPDIR says
    token = directory / "auth_token"
    if not token.is_file():
        token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_TMPDIR": str(directory),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def use_in_this_process(private: dict[str, str]) -> None:
    """Make this process (the cluster's driver) see the private settings although Ray
    read its configuration when it was imported: Ray's own `_enable_token_auth` refreshes
    it the same way after setting the auth mode."""
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    os.environ.update(private)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    ray_constants.ENABLE_RAY_CLUSTER = False  # the variable is for the processes it starts


def start_local_cluster(shape: LocalClusterShape, directory: Path) -> object:
    """Start the cluster in `directory` (see `ray_directory`), connect this process as its
    driver and return the Cluster handle."""
    import ray
    from ray.cluster_utils import Cluster

    private = private_ray_environment(directory)
    use_in_this_process(private)
    common = {"node_ip_address": LOOPBACK, "temp_dir": str(directory / "ray")}
    with scrubbed_process(private):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "num_gpus": 0,
                "include_dashboard": False,
                **common,
            },
        )
        for index in range(1, shape.num_nodes + 1):
            cluster.add_node(
                num_gpus=shape.gpus_per_node,
                num_cpus=shape.cpus_per_node,
                labels={NODE_NAME_LABEL: f"local-{index}"},
                runtime_env_dir_name=f"runtime_resources_node{index}",
                **common,
            )
    ray.init(address=cluster.address, namespace="gangway", log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def start_watchdog(cluster: object) -> subprocess.Popen[bytes]:
    """Start `ray_watchdog` for this process and the cluster's session: if this process
    dies without stopping the cluster (SIGKILL), the watchdog kills the cluster. In a
    session of its own, so a signal to the service's process group leaves it running."""
    session_dir = cluster.head_node.get_session_dir_path()  # type: ignore[attr-defined]
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler.runtime.ray_watchdog", str(os.getpid()), session_dir],
        start_new_session=True,
    )
