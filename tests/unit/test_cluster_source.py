"""Ray's node records -> the core's nodes."""

from __future__ import annotations

from scheduler.runtime.cluster import node_from_ray


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
