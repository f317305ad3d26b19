"""Leader lease: one scheduling loop acts per database.

Two `gangway serve` processes on one PostgreSQL would both admit the same job and launch
it twice. Each loop holds a lease row in the store, renewed on every pass; a loop whose
lease is held by another waits (a hot standby) and takes over once it has expired
(`ttl_s` after the leader's last renewal, or at once when the leader stops cleanly). On
taking over it reconciles first: it reattaches the gangs the old leader launched.

Expiry compares the store's rows with this host's clock: hosts must agree on time to well
under `ttl_s`. A leader stalled past its lease may still finish the pass it was in;
transitions check the state they expect, so a move made by the new leader meanwhile wins.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from scheduler.store import JobRepository


def holder_id() -> str:
    """Host, process and a random part: unique even for two processes in one container."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class LeaderLease:
    repo: JobRepository
    ttl_s: float = 15.0
    name: str = "scheduler"
    holder: str = field(default_factory=holder_id)

    def hold(self) -> bool:
        """Take or renew the lease; False while another loop holds it."""
        return self.repo.hold_lease(self.name, self.holder, self.ttl_s)

    def release(self) -> None:
        self.repo.release_lease(self.name, self.holder)
