"""Leader lease: one scheduling loop acts per database, and only while it provably leads.

Two `gangway serve` processes on one PostgreSQL would both admit the same job and launch
it twice. Each holds for a lease row (`scheduler.store.leases`); the one that has it is
the leader, the others stand by (a hot standby) and take over once it has expired (`ttl_s`
after the leader's last renewal, by the database's clock, or at once when the leader
stops cleanly). Every takeover raises the lease's generation.

The leader renews from a heartbeat thread of its own, every `ttl_s / 3`, so a long pass
(a slow reconcile, many hung jobs) never lets the lease lapse. A leader that is paused
anyway (a frozen process) is fenced: its store writes check the generation inside their
transaction, and each executor action first checks that the lease is still its own for
at least `ttl_s / 3`, the bound on any one Ray call the loop makes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from scheduler.store import Fence, Fenced, FenceSlot
from scheduler.store.leases import LeaseStore
from workers import faults

log = logging.getLogger(__name__)


def holder_id() -> str:
    """Host, process and a random part: unique even for two processes in one container."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


DEFAULT_TTL_S = 15.0  # GANGWAY_LEASE_TTL_S starts from it


@dataclass
class LeaderLease:
    leases: LeaseStore  # the JobRepository, or a LeaseStore over the same database
    ttl_s: float = DEFAULT_TTL_S
    name: str = "scheduler"
    holder: str = field(default_factory=holder_id)
    _fence: Fence | None = field(default=None, init=False)
    _renewed_at: float = field(default=0.0, init=False)  # monotonic, of the last success
    _thread: threading.Thread | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)

    @property
    def action_bound_s(self) -> float:
        """How long one action outside the database (a Ray call) may take: a third of the
        TTL, so a check made before it still holds when it ends."""
        return self.ttl_s / 3

    def renew(self) -> Fence | None:
        """Take or renew the lease once; the fence to write with, or None."""
        faults.inject("lease.renew")
        try:
            fence = self.leases.hold_lease(self.name, self.holder, self.ttl_s)
        except Exception:
            log.exception("could not renew the scheduler lease")
            return self.current()
        self._fence = fence
        if fence is not None:
            self._renewed_at = time.monotonic()
        return fence

    def current(self) -> Fence | None:
        """The fence while this process leads: without a heartbeat thread (tests), renew
        now; with one, the last renewal's, unless it is older than the TTL."""
        if self._thread is None:
            return self.renew()
        if self._fence is not None and time.monotonic() - self._renewed_at > self.ttl_s:
            return None
        return self._fence

    def guard(self, slot: FenceSlot) -> None:
        """Raise `Fenced` unless the slot's fence leads for `action_bound_s` more. A lease
        that is still this fence's but short of that (a heartbeat a little late: the
        thread renews every `action_bound_s`, so any delay leaves less) is renewed once
        here for a full TTL, only while unexpired and of the same generation."""
        fence = slot.require()
        try:
            self.leases.check_lease(fence, valid_for_s=self.action_bound_s)
        except Fenced:
            if not self.leases.extend_lease(fence, self.ttl_s):
                raise
            self._renewed_at = time.monotonic()

    def start(self) -> None:
        """Renew from a thread of its own from now on."""
        self.renew()
        self._thread = threading.Thread(target=self._heartbeat, name="gangway-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and give the lease up, so a standby need not wait out the TTL."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if self._fence is not None:
            self.leases.release_lease(self._fence)
            self._fence = None

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew()
