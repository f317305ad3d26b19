"""Cluster sources: where the loop's snapshot of nodes comes from."""

from __future__ import annotations

from typing import Any, Protocol

from scheduler.model import Node

NODE_NAME_LABEL = "gangway.io/node"
RACK_LABEL = "gangway.io/rack"  # set with `ray start --labels` on nodes that share a rack
GPU_TYPE_LABEL = "gangway.io/gpu-type"  # names the node's GPUs where Ray does not know them
ACCELERATOR_RESOURCE = "accelerator_type:"  # Ray's own, on nodes whose GPUs it detected


class ClusterSource(Protocol):
    def nodes(self) -> list[Node]:
        """Every node that has GPUs, alive or not."""
        ...


class DriverNodeLost(RuntimeError):
    """Ray's head declared the node this service drives Ray from dead: the service's host
    lost its link to the head for longer than the head's health check. The node's raylet
    has exited, so what needs it (putting a shipped package into the object store) would
    hang; the service exits, to be restarted on a live node and reattach."""


class RayClusterSource:
    """Reads `ray.nodes()`; nodes without GPUs (the head, CPU-only workers) are skipped.
    Raises `DriverNodeLost` once the service's own node is dead."""

    def nodes(self) -> list[Node]:
        import ray

        raw_nodes = ray.nodes()
        own = ray.get_runtime_context().get_node_id()
        for raw in raw_nodes:
            if raw.get("NodeID") == own and not raw.get("Alive", False):
                raise DriverNodeLost(
                    f"the Ray head declared this service's node ({raw.get('NodeManagerAddress')}) "
                    "dead: the link between the service's host and the head failed for longer "
                    "than its health check"
                )
        return [node for raw in raw_nodes if (node := node_from_ray(raw)) is not None]


def node_from_ray(raw: dict[str, Any]) -> Node | None:
    resources = raw.get("Resources", {})
    num_gpus = int(resources.get("GPU", 0))
    if num_gpus == 0:
        return None
    node_id = str(raw["NodeID"])
    labels = raw.get("Labels") or {}
    name = labels.get(NODE_NAME_LABEL) or f"{raw.get('NodeManagerHostname', 'node')}-{node_id[:6]}"
    return Node(
        id=node_id,
        name=name,
        num_gpus=num_gpus,
        num_cpus=float(resources.get("CPU", 0.0)),
        alive=bool(raw.get("Alive", False)),
        rack=labels.get(RACK_LABEL),
        gpu_type=gpu_type(labels, resources),
    )


def gpu_type(labels: dict[str, str], resources: dict[str, float]) -> str | None:
    """The node's GPU type: its label, else the accelerator type Ray detected (a resource
    `accelerator_type:H100`), else not known."""
    if labels.get(GPU_TYPE_LABEL):
        return labels[GPU_TYPE_LABEL]
    detected = sorted(k for k in resources if k.startswith(ACCELERATOR_RESOURCE))
    return detected[0].removeprefix(ACCELERATOR_RESOURCE) if detected else None
