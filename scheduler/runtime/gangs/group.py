"""A worker group: one Ray placement group + one rank supervisor actor per rank, for one job
attempt.

Bundle i is pinned to the node the scheduler chose for rank i with a `ray.io/node-id`
label selector, so what Ray runs is exactly the decision that the store holds. The group
and its actors are detached and named after (job, attempt): a service that restarts finds
them again with `WorkerGroup.attach` instead of losing the job.

`poll()` never blocks: it advances a small state machine
(placing -> rendezvous -> running -> succeeded | failed) with `ray.wait(timeout=0)`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
)
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from scheduler.runtime.gangs.status import (
    CAUSE_GRACE_S,
    TROUBLE_GRACE_S,
    GroupPhase,
    GroupStatus,
    aggregate,
)
from scheduler.store.records import ReportedPoint
from workers.launch import JobLaunch, RankInfo
from workers.supervisor.actor import IDLE, RankSupervisor

NAMESPACE = "gangway"
log = logging.getLogger(__name__)
T = TypeVar("T")


class PlacementMismatch(RuntimeError):
    pass


@dataclass(frozen=True)
class GroupSpec:
    """One attempt's gang: the node of each rank, what each rank reserves, the degrees,
    and the launch every rank's supervisor gets."""

    node_ids: tuple[str, ...]
    gpus_per_rank: int
    cpus_per_rank: float
    dp: int
    tp: int
    pp: int
    launch: JobLaunch
    # The shipped working directory's zip on the service's disk: put into Ray's object
    # store when the actors are made, fetched from there by each node that needs it.
    package_file: Path | None = None

    @property
    def job_id(self) -> int:
        return self.launch.job_id

    @property
    def attempt(self) -> int:
        return self.launch.attempt

    @property
    def name(self) -> str:
        return group_name(self.job_id, self.attempt)

    @property
    def world_size(self) -> int:
        return len(self.node_ids)

    @property
    def kind(self) -> str:
        return self.launch.run.kind

    def rank_info(self, rank: int) -> RankInfo:
        node = self.node_ids[rank]
        return RankInfo(
            rank=rank,
            world_size=self.world_size,
            local_rank=self.node_ids[:rank].count(node),
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            local_world_size=self.node_ids.count(node),
        )


class WorkerGroup:
    def __init__(
        self,
        spec: GroupSpec,
        pg: PlacementGroup,
        *,
        placement_timeout_s: float,
        actors: list[Any] | None = None,
        trouble_grace_s: float = TROUBLE_GRACE_S,
        call_timeout_s: float = 5.0,
    ) -> None:
        self.spec = spec
        self._trouble_grace_s = trouble_grace_s
        # The longest any blocking Ray call of this group may wait (the loop keeps it
        # under its lease's bound, so no call outlives the leadership it was made under).
        self._call_timeout_s = call_timeout_s
        self._trouble_since: float | None = None
        # When a poll first saw a failed rank beside running ones (see `CAUSE_GRACE_S`).
        self._failure_seen: float | None = None
        self._pg = pg
        self._placement_timeout_s = placement_timeout_s
        self._created = time.monotonic()
        self._actors: list[Any] = actors or []
        self._phase = GroupPhase.RUNNING if actors else GroupPhase.PLACING
        self._address_ref: Any = None
        self._start_refs: list[Any] | None = None
        self._status_refs: list[Any] | None = None
        self._round_asked = 0.0  # when the outstanding status round was asked (monotonic)
        # The newest output line fetched per rank. A group attached after a service
        # restart starts at 0: the store drops lines it already has.
        self._log_cursor = [0] * spec.world_size
        # The same for rank 0's reported metric points (the job's metrics are rank 0's).
        self._point_cursor = 0
        self._lost_nodes: tuple[str, ...] = ()
        self._last = GroupStatus(self._phase, ranks_started=bool(actors))
        self._error: str | None = None

    # -- creation ---------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        spec: GroupSpec,
        *,
        placement_timeout_s: float,
        call_timeout_s: float = 5.0,
        trouble_grace_s: float = TROUBLE_GRACE_S,
    ) -> WorkerGroup:
        """Ask Ray for the pinned placement group; actors follow once it is ready."""
        bundle = {"GPU": float(spec.gpus_per_rank), "CPU": float(spec.cpus_per_rank)}
        pg = placement_group(
            [dict(bundle) for _ in spec.node_ids],
            strategy="PACK",
            name=spec.name,
            lifetime="detached",
            bundle_label_selector=[{"ray.io/node-id": node_id} for node_id in spec.node_ids],
        )
        return cls(
            spec,
            pg,
            placement_timeout_s=placement_timeout_s,
            call_timeout_s=call_timeout_s,
            trouble_grace_s=trouble_grace_s,
        )

    @classmethod
    def attach(
        cls,
        spec: GroupSpec,
        *,
        call_timeout_s: float = 5.0,
        trouble_grace_s: float = TROUBLE_GRACE_S,
    ) -> WorkerGroup | None:
        """Reattach to the group a previous service process started for this attempt.

        If only parts of it are left (the service died while launching, a rank is gone),
        those parts are torn down, so no GPU stays reserved by a gang nobody watches.
        """
        pg = _lookup(lambda: get_placement_group(spec.name))
        found = [_named_actor(spec, rank) for rank in range(spec.world_size)]
        actors = [actor for actor in found if actor is not None]
        complete = pg is not None and len(actors) == spec.world_size
        if complete and _all_started(actors, call_timeout_s):
            return cls(
                spec,
                pg,
                placement_timeout_s=0,
                actors=actors,
                call_timeout_s=call_timeout_s,
                trouble_grace_s=trouble_grace_s,
            )
        _teardown(pg, actors)
        return None

    # -- polling ----------------------------------------------------------------------

    def poll(self) -> GroupStatus:
        try:
            if self._phase is GroupPhase.PLACING:
                self._poll_placing()
            if self._phase is GroupPhase.RENDEZVOUS:
                self._poll_rendezvous()
            if self._phase is GroupPhase.RUNNING:
                self._poll_running()
        except ActorUnavailableError as exc:  # before RayActorError, its base class
            self._trouble(f"a rank's actor is unreachable: {exc}")
        except RayActorError as exc:
            self._lost_nodes = self._nodes_of_dead_ranks()
            where = ", ".join(sorted(set(self._lost_nodes))) or "unknown"
            self._fail(f"a rank's actor died (node {where}): {exc}")
        except PlacementMismatch as exc:
            self._fail(str(exc))
        except RayError as exc:
            self._trouble(f"Ray error: {exc}")
        else:
            if self._status_refs is None:  # Ray answered: no status round is outstanding
                self._trouble_since = None
        if self._phase in (GroupPhase.FAILED, GroupPhase.PLACEMENT_TIMEOUT):
            self._last = replace(
                self._last, phase=self._phase, error=self._error, lost_nodes=self._lost_nodes
            )
        status = self._last
        if status.logs:
            self._last = replace(status, logs=())
        return status

    def _poll_placing(self) -> None:
        # The GCS's table says whether the reservation is made. pg.ready() would submit a
        # probe task on every poll, and pg.wait(timeout_seconds=0) answers False for a
        # created group (seen with Ray 2.60: every zero-timeout wait timed out).
        if placement_group_table(self._pg).get("state") != "CREATED":
            if time.monotonic() - self._created > self._placement_timeout_s:
                self._phase = GroupPhase.PLACEMENT_TIMEOUT
                self._error = (
                    f"Ray could not reserve the placement within {self._placement_timeout_s:.0f} s"
                )
            return
        try:
            package = self._shipped_package()
        except OSError as exc:
            self._fail(f"the working directory's package cannot be read: {exc}")
            return
        self._actors = [self._create_actor(rank, package) for rank in range(self.spec.world_size)]
        scripted = self.spec.kind in ("script", "command")
        store_for = self.spec.world_size if scripted else None  # torchrun's agent store
        self._address_ref = self._actors[0].rendezvous_address.remote(store_for)
        self._phase = GroupPhase.RENDEZVOUS

    def _shipped_package(self) -> list[Any] | None:
        """The zip in Ray's object store, owned by this process (the service); it lives
        while an actor still holds the reference (a supervisor drops it once unpacked).
        A reference in a list, so Ray passes it unresolved."""
        if self.spec.package_file is None:
            return None
        return [ray.put(self.spec.package_file.read_bytes())]

    def _create_actor(self, rank: int, package: list[Any] | None) -> Any:
        """Rank `rank`'s supervisor, in its bundle. Threaded (a status poll is answered
        while a stack request waits on the program); no runtime_env: the job's code and
        requirements are the supervisor's to place in the sandbox, never Ray's worker's."""
        remote_cls = ray.remote(RankSupervisor)
        return remote_cls.options(
            name=_actor_name(self.spec, rank),
            namespace=NAMESPACE,
            lifetime="detached",
            num_gpus=self.spec.gpus_per_rank,
            num_cpus=self.spec.cpus_per_rank,
            max_restarts=0,
            max_concurrency=4,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=rank
            ),
        ).remote(self.spec.launch, self.spec.rank_info(rank), package)

    def _poll_rendezvous(self) -> None:
        """Rank 0's address first, then `start` on every rank; both without blocking."""
        if self._start_refs is None:
            ready, _ = ray.wait([self._address_ref], timeout=0)
            if not ready:
                return
            master_addr, master_port = ray.get(self._address_ref)
            self._start_refs = [
                actor.start.remote(master_addr=master_addr, master_port=master_port)
                for actor in self._actors
            ]
        ready, _ = ray.wait(self._start_refs, num_returns=len(self._start_refs), timeout=0)
        if len(ready) < len(self._start_refs):
            return
        self._check_placement(ray.get(self._start_refs))
        self._phase = GroupPhase.RUNNING
        self._last = GroupStatus(GroupPhase.RUNNING, ranks_started=True)

    def _check_placement(self, node_ids: list[str]) -> None:
        """Ray must run rank i where the scheduler put it; anything else is a bug to surface."""
        for rank, (wanted, actual) in enumerate(zip(self.spec.node_ids, node_ids, strict=True)):
            if wanted != actual:
                raise PlacementMismatch(f"Ray ran rank {rank} on node {actual}, not {wanted}")

    def _poll_running(self) -> None:
        now = time.monotonic()
        if self._status_refs is None:
            self._status_refs = [
                self._ask_status(rank, actor) for rank, actor in enumerate(self._actors)
            ]
            self._round_asked = now
        ready, _ = ray.wait(self._status_refs, num_returns=len(self._status_refs), timeout=0)
        if len(ready) < len(self._status_refs):
            if now - self._round_asked > self._trouble_grace_s:
                self._fail_silent(ready, now)
            return
        statuses = ray.get(self._status_refs)
        self._status_refs = None
        seen = self._failure_seen
        status = aggregate(statuses, wait_for_cause=seen is None or now - seen < CAUSE_GRACE_S)
        if status.cause_pending and seen is None:
            self._failure_seen = now
        self._last = replace(
            status, logs=self._new_lines(statuses), points=self._new_points(statuses)
        )
        self._phase = self._last.phase
        self._error = self._last.error

    def _fail_silent(self, ready: list[Any], now: float) -> None:
        """A status call is answered in milliseconds (the supervisor is threaded: a busy
        or hung rank program does not hold it up), so a round still unanswered after
        `trouble_grace_s` means a supervisor that is stuck itself or on a node Ray cannot
        reach but has not called dead: the gang fails, naming the silent ranks, and the
        job is retried or ends instead of staying RUNNING with no news. The answered
        ranks' last output is kept; one of them that died fails the gang as a death. The
        silent ranks' nodes are suspect, as a dead rank's are: Ray's health check can
        call an unreachable node alive for a minute or more, and a restart placed there
        would wait out the placement timeout (a stuck supervisor on a healthy node costs
        that node the suspect time)."""
        assert self._status_refs is not None
        answers = dict(zip(ready, ray.get(ready), strict=True))  # raises for a dead rank
        self._keep_output([answers.get(ref, {}) for ref in self._status_refs])
        silent = [rank for rank, ref in enumerate(self._status_refs) if ref not in answers]
        self._lost_nodes = tuple(dict.fromkeys(self.spec.node_ids[rank] for rank in silent))
        ranks = ", ".join(str(rank) for rank in silent)
        waited = now - self._round_asked
        self._fail(
            f"rank(s) {ranks} (node {', '.join(sorted(self._lost_nodes))}) did not answer a "
            f"status call in {waited:.0f} s: a stuck supervisor or an unreachable node"
        )

    def _nodes_of_dead_ranks(self) -> tuple[str, ...]:
        """Ask every rank once more (briefly): the nodes of those whose actor is gone. A
        node can die long before Ray's health check calls it dead. The live ranks' last
        output comes back with the answer, so a failing gang's final lines are kept."""
        answers = self._ask_every_rank(self._ask_status, timeout_s=self._call_timeout_s)
        self._keep_output([a if isinstance(a, dict) else {} for a in answers])
        dead = [
            self.spec.node_ids[rank]
            for rank, answer in enumerate(answers)
            if isinstance(answer, RayActorError)  # slow is not dead
        ]
        return tuple(dict.fromkeys(dead))

    def _keep_output(self, statuses: list[dict[str, Any]]) -> None:
        """A failing gang's last output lines and metric points, from the ranks that
        answered (`{}` for those that did not), added to what the next poll hands out."""
        self._last = replace(
            self._last,
            logs=self._last.logs + self._new_lines(statuses),
            points=self._last.points + self._new_points(statuses),
        )

    def _ask_every_rank(
        self, call: Callable[[int, Any], Any], *, timeout_s: float
    ) -> list[Any | RayError]:
        """Call every rank at once and wait up to `timeout_s`: each rank's answer, or the
        error in its place (`GetTimeoutError` for a rank that did not answer in time)."""
        refs = [call(rank, actor) for rank, actor in enumerate(self._actors)]
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        answers: list[Any | RayError] = []
        for ref in refs:
            try:
                answers.append(ray.get(ref, timeout=0))
            except RayError as exc:
                answers.append(exc)
        return answers

    def _ask_status(self, rank: int, actor: Any) -> Any:
        """A rank's status with its output lines past the cursor; rank 0's also carries
        its metric points past theirs."""
        points_after = self._point_cursor if rank == 0 else None
        return actor.status.remote(self._log_cursor[rank], points_after)

    def _new_points(self, statuses: list[dict[str, Any]]) -> tuple[ReportedPoint, ...]:
        points = []
        for number, point in statuses[0].get("points", ()) if statuses else ():
            points.append(ReportedPoint.from_wire(int(number), point))
            self._point_cursor = max(self._point_cursor, int(number))
        return tuple(points)

    def _new_lines(self, statuses: list[dict[str, Any]]) -> tuple[tuple[int, int, str], ...]:
        lines = []
        for rank, status in enumerate(statuses):
            for number, line in status.get("logs", ()):
                lines.append((rank, int(number), str(line)))
                self._log_cursor[rank] = max(self._log_cursor[rank], int(number))
        return tuple(lines)

    def _fail(self, error: str) -> None:
        self._phase = GroupPhase.FAILED
        self._error = error

    def _trouble(self, error: str) -> None:
        """Ray could not answer this time (an unreachable actor, a control-plane error).
        The ranks may well be training: keep the last status and ask again next poll;
        only trouble that lasts `trouble_grace_s` fails the gang."""
        self._status_refs = None
        now = time.monotonic()
        if self._trouble_since is None:
            self._trouble_since = now
        lasted = now - self._trouble_since
        if lasted > self._trouble_grace_s:
            self._fail(f"{error} (for {lasted:.0f} s)")
        else:
            log.warning("job %s: %s; asking again", self.spec.job_id, error)

    # -- teardown ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every rank to stop after its current step (cooperative)."""
        for actor in self._actors:
            actor.stop.remote()

    def stacks(self) -> str:
        """Every rank's Python stacks, rank by rank; a rank that does not answer within
        the call timeout says so instead (a hung program still answers: its control
        channel has a thread of its own)."""
        timeout_s = self._call_timeout_s
        answers = self._ask_every_rank(
            lambda _rank, actor: actor.stacks.remote(), timeout_s=timeout_s
        )
        sections = []
        for rank, answer in enumerate(answers):
            if isinstance(answer, GetTimeoutError):
                text = f"(no answer in {timeout_s:.0f} s)"
            elif isinstance(answer, RayError):
                text = f"(could not ask it: {answer})"
            else:
                text = str(answer)
            sections.append(f"=== rank {rank} ===\n{text}")
        return "\n".join(sections)

    def teardown(self) -> None:
        """Kill the ranks and free the placement group; safe to call more than once."""
        _teardown(self._pg, self._actors)
        self._actors = []


def group_name(job_id: int, attempt: int) -> str:
    return f"gangway-job{job_id}-attempt{attempt}"


# What `group_name` and `_actor_name` make: the placement group, or one of its ranks.
_OWNED_NAME = re.compile(r"gangway-job(\d+)-attempt(\d+)(?:-rank\d+)?")


def attempts_on_ray() -> set[tuple[int, int]]:
    """Every (job, attempt) Ray holds a Gangway placement group or rank actor for,
    whatever process made it: found by name in the GCS (placement groups not yet
    removed, named actors alive in Gangway's namespace), so no handle is needed."""
    names = [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == NAMESPACE
    ]
    names += [
        entry["name"]
        for entry in placement_group_table().values()
        if entry.get("state") != "REMOVED"
    ]
    return {
        (int(match[1]), int(match[2]))
        for name in names
        if (match := _OWNED_NAME.fullmatch(name or "")) is not None
    }


def reap(job_id: int, attempt: int) -> None:
    """Tear down whatever Ray still runs for one attempt of a job, whatever its size: a
    service that restarted in the middle of a resize no longer knows the old world size."""
    name = group_name(job_id, attempt)
    names = [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == NAMESPACE and entry["name"].startswith(f"{name}-rank")
    ]
    found = [_named(actor_name) for actor_name in names]
    _teardown(_lookup(lambda: get_placement_group(name)), [a for a in found if a is not None])


def _teardown(pg: PlacementGroup | None, actors: list[Any]) -> None:
    for actor in actors:
        with contextlib.suppress(ValueError, RayError):
            ray.kill(actor, no_restart=True)
    if pg is not None:
        with contextlib.suppress(ValueError, RayError):
            remove_placement_group(pg)


def _lookup(find: Callable[[], T]) -> T | None:
    """A named Ray object, or None when Ray has no object of that name."""
    try:
        return find()
    except ValueError:
        return None


def _named_actor(spec: GroupSpec, rank: int) -> Any | None:
    return _named(_actor_name(spec, rank))


def _named(actor_name: str) -> Any | None:
    return _lookup(lambda: ray.get_actor(actor_name, namespace=NAMESPACE))


def _all_started(actors: list[Any], timeout_s: float) -> bool:
    try:
        statuses = ray.get([a.status.remote() for a in actors], timeout=timeout_s)
    except RayError:
        return False
    return all(s["phase"] != IDLE for s in statuses)


def _actor_name(spec: GroupSpec, rank: int) -> str:
    return f"{spec.name}-rank{rank}"
