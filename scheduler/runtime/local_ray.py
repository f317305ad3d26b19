"""Start the embedded local Ray: a head without resources plus N logical GPU nodes.

Ray's `cluster_utils.Cluster` starts real raylets on this machine, each advertising
`num_gpus` logical GPUs, so gang placement across nodes is exercised exactly as on a real
cluster; on a CPU machine the ranks use gloo. Its processes start with the allow-listed
environment only: raylets hand theirs to every worker, and the service's holds secrets.

All its raylets share the head's session directory, and by default Ray keeps each node's
runtime_env cache (unpacked working directories, pip virtualenvs) in that session's
`runtime_resources`: two raylets building the same virtualenv there at once collide
("dest dir ... exists"; Ray issue #17086 is the same race for conda). Each node gets a
directory of its own (RayParams `runtime_env_dir_name`), as on separate hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from scheduler.runtime.cluster import NODE_NAME_LABEL
from workers.supervisor.environment import scrubbed_process


@dataclass(frozen=True)
class LocalClusterShape:
    num_nodes: int = 2
    gpus_per_node: int = 4
    cpus_per_node: int = 8


def start_local_cluster(shape: LocalClusterShape) -> object:
    """Start the cluster, connect this process as its driver and return the Cluster handle."""
    import ray
    from ray.cluster_utils import Cluster

    with scrubbed_process():
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False},
        )
        for index in range(1, shape.num_nodes + 1):
            cluster.add_node(
                num_gpus=shape.gpus_per_node,
                num_cpus=shape.cpus_per_node,
                labels={NODE_NAME_LABEL: f"local-{index}"},
                runtime_env_dir_name=f"runtime_resources_node{index}",
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
