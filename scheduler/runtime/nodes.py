"""The cluster's nodes as the loop sees them: Ray's view, minus nodes under suspicion."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from scheduler.model import Node
from scheduler.runtime.cluster import ClusterSource
from scheduler.store import JobRepository

Speeds = Callable[[Sequence[Node]], Mapping[str, float]]


class NodeWatch:
    """Nodes where a gang's ranks were lost are not placed on for `suspect_s`: Ray may
    report a dead node alive for a while (its health check is slower than ours). Each
    node carries its GPU type's speed as `speeds` knows it (by type name, "" for none)."""

    def __init__(
        self,
        repo: JobRepository,
        cluster: ClusterSource,
        clock: Callable[[], datetime],
        suspect_s: float,
        speeds: Speeds | None = None,
    ) -> None:
        self._speeds = speeds
        self._repo = repo
        self._cluster = cluster
        self._clock = clock
        self._suspect_s = suspect_s
        self._suspects: dict[str, datetime] = {}
        self.names: dict[str, str] = {}
        self._stored: list[Node] | None = None  # what the store holds, once written

    def suspect(self, node_id: str) -> str:
        """Mark the node a suspect; its name (its id when never seen), for the reason."""
        self._suspects[node_id] = self._clock()
        return self.names.get(node_id, node_id)

    def restore(self) -> None:
        """Write the nodes at the next refresh even if unchanged: after a takeover the
        store holds what another leader saw."""
        self._stored = None

    def refresh(self) -> list[Node]:
        """Read the nodes, store them, and return them with suspects marked dead."""
        now = self._clock()
        self._suspects = {
            node: at
            for node, at in self._suspects.items()
            if (now - at).total_seconds() < self._suspect_s
        }
        nodes = [
            replace(node, alive=False) if node.id in self._suspects else node
            for node in self._cluster.nodes()
        ]
        if self._speeds is not None:
            speeds = self._speeds(nodes)
            nodes = [_with_speed(n, speeds) for n in nodes]
        if nodes != self._stored:  # a thousand nodes rewritten every pass cost more than a pass
            self._repo.replace_nodes(nodes)
            self._stored = nodes
        # Names of every node seen alive: Ray may stop reporting a dead node's labels, and
        # a dead node is when a reason needs its name (one entry per raylet ever started).
        self.names.update((node.id, node.name) for node in nodes if node.alive)
        return nodes


def _with_speed(node: Node, speeds: Mapping[str, float]) -> Node:
    speed = speeds.get(node.gpu_type_key, node.gpu_speed)
    return node if speed == node.gpu_speed else replace(node, gpu_speed=speed)
