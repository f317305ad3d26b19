"""Ray's node records -> the core's nodes."""

from __future__ import annotations

import pytest

from scheduler.runtime.cluster import DriverNodeLost, RayClusterSource, node_from_ray


def test_gpu_nodes_with_labels() -> None:
    raw = {
        "NodeID": "abc123",
        "Alive": True,
        "Resources": {"GPU": 8.0, "CPU": 96.0},
        "Labels": {"gangway.io/node": "gpu-7", "gangway.io/rack": "r2"},
        "NodeManagerHostname": "host7",
    }
    node = node_from_ray(raw)
    assert node is not None
    assert (node.id, node.name, node.num_gpus, node.num_cpus, node.alive, node.rack) == (
        "abc123",
        "gpu-7",
        8,
        96.0,
        True,
        "r2",
    )


def test_nodes_without_gpus_are_not_schedulable_and_names_fall_back() -> None:
    assert node_from_ray({"NodeID": "h", "Resources": {"CPU": 4.0}}) is None
    node = node_from_ray(
        {"NodeID": "def456", "Resources": {"GPU": 2.0}, "NodeManagerHostname": "h"}
    )
    assert node is not None and node.name == "h-def456" and node.rack is None and not node.alive


def test_the_services_own_node_dead_is_a_lost_driver_not_a_node_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray's head declared the node this service drives Ray from dead (its raylet has
    exited): the source says so instead of listing nodes; another dead node is listed."""
    import ray

    class Context:
        def get_node_id(self) -> str:
            return "service-node"

    raw = [
        {
            "NodeID": "service-node",
            "Alive": False,
            "Resources": {},
            "NodeManagerAddress": "10.0.0.1",
        },
        {"NodeID": "gpu-node", "Alive": False, "Resources": {"GPU": 2.0}},
    ]
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(ray, "nodes", lambda: raw)
    with pytest.raises(DriverNodeLost, match=r"declared this service's node \(10.0.0.1\) dead"):
        RayClusterSource().nodes()
    raw[0]["Alive"] = True
    assert [(n.id, n.alive) for n in RayClusterSource().nodes()] == [("gpu-node", False)]
