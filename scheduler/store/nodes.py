"""The cluster's nodes as the loop last saw them (the API reads them from here)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from scheduler.model import Node
from scheduler.store.base import Repository
from scheduler.store.tables import NodeRow


class NodeStore(Repository):
    def replace_nodes(self, nodes: Sequence[Node]) -> None:
        """Store the cluster snapshot the scheduler just took (the API reads it)."""
        now = self._clock()
        with Session(self._engine) as session, session.begin():
            self._guard(session)
            session.execute(delete(NodeRow))
            session.add_all(
                NodeRow(
                    id=n.id,
                    name=n.name,
                    num_gpus=n.num_gpus,
                    num_cpus=n.num_cpus,
                    alive=n.alive,
                    rack=n.rack,
                    gpu_type=n.gpu_type,
                    gpu_speed=n.gpu_speed,
                    updated_at=now,
                )
                for n in nodes
            )

    def nodes(self) -> list[Node]:
        with Session(self._engine) as session:
            rows = session.scalars(select(NodeRow).order_by(NodeRow.name, NodeRow.id))
            return [
                Node(
                    r.id,
                    r.name,
                    r.num_gpus,
                    r.num_cpus,
                    r.alive,
                    r.rack,
                    gpu_type=r.gpu_type,
                    gpu_speed=r.gpu_speed,
                )
                for r in rows
            ]
