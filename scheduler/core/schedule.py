"""One scheduling pass: order, admit, reserve, preempt, backfill, explain.

    schedule(snapshot, jobs, now, config) -> [Admit | Preempt | Wait]

1. Free capacity = alive nodes minus what holders (admitted .. preempting jobs) use.
2. Pending jobs in queue order: priority + aging, protected jobs first within it, then
   service band (`ordering.queue_order`). A protected job's decisions say why.
3. The release timeline: when each holder is expected to give its resources back.
4. Walk the queue. A job that fits and does not delay the reservation is admitted. A
   job that cannot start preempts lower-ranked gangs if that makes it fit. Without
   `reservations` (the default) each blocked job in turn may, and only a protected one
   is reserved its start: the others hold nothing (greedy backfill; with backfill off,
   strict order behind the first blocked job). With them, the first job that cannot
   make room (and has not run before, or is protected) is reserved its earliest start
   on the timeline, on GPUs that running gangs release by then where they hold it (the
   GPUs free now stay for the jobs behind it); later jobs start now only if they leave
   that start intact (EASY backfill), or preempt lower-ranked gangs where the room they
   take leaves it intact (the first `preemption_tries` of them). Every wait carries a
   structured explanation and an estimated start: the first `eta_jobs` blocked jobs
   placed on the timeline, the rest (and every job that holds nothing) by GPU count
   behind the jobs blocked ahead.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from scheduler.core.config import PolicyConfig
from scheduler.core.decisions import (
    Admit,
    Blocker,
    Decision,
    Explanation,
    Preempt,
    Resize,
    Wait,
    protection_note,
)
from scheduler.core.dependencies import Upstream, dependency_waits
from scheduler.core.elastic import grown, replica_nodes, shrunk
from scheduler.core.ordering import (
    attained_gpu_s,
    protected,
    protection_ratio,
    queue_order,
    rank,
    remaining_gpu_s,
)
from scheduler.core.placement import (
    NOTHING,
    Capacity,
    FreePool,
    Kind,
    place_gang,
    total_capacity,
    usage,
)
from scheduler.core.preemption import VictimPool, choose_victims, freed_by, victim_pool
from scheduler.core.quotas import (
    borrowing_jobs,
    gpus_by_queue,
    over_limit,
    within_guarantee,
)
from scheduler.core.timeline import (
    Release,
    Start,
    earliest_start,
    expected_end,
    expected_runtime_s,
    release_timeline,
)
from scheduler.model import (
    RESOURCE_HOLDING_STATES,
    ClusterSnapshot,
    GangShape,
    JobState,
    JobView,
    Placement,
    QueueQuota,
)


@dataclass
class _Reservation:
    """The start held for the first job that cannot start now. Backfill must leave
    `future` (capacity at `at`) able to hold `needed` (the planned placement's usage)."""

    job: JobView
    at: datetime
    placement: Placement
    future: dict[str, Capacity]
    needed: dict[str, Capacity]


@dataclass
class _Pass:
    now: datetime
    config: PolicyConfig
    free: FreePool
    holders: list[JobView]
    releases: list[Release]
    node_gpus: int  # the largest node's GPUs: one node, for `gang_size`
    reservation: _Reservation | None = None
    spare: FreePool | None = None  # free minus what the reservation needs: harmless to use
    decisions: list[Decision] = field(default_factory=list)
    etas_left: int = 0
    queues: Mapping[str, QueueQuota] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)  # queue -> max GPUs, where capped
    queue_used: dict[str, int] = field(default_factory=dict)
    borrowed: set[int] = field(default_factory=set)
    shortage_memo: dict[tuple[object, ...], Explanation] = field(default_factory=dict)
    blocked_gpus: int = 0  # GPUs asked by the reserved and blocked jobs so far
    # Waits to estimate by GPU count: (index in decisions, blocked GPUs up to that job, not
    # before: the reserved start, or the estimate of the decision at that index, or now)
    rough_etas: list[tuple[int, int, datetime | int | None]] = field(default_factory=list)
    # Holders that could be preempted at all, cheapest first (`victim_order`), with their
    # ranks: built by the first preemption attempt of the pass; a gang preempted or
    # resized in the pass leaves it.
    victim_pool: VictimPool | None = None
    ranks: dict[int, tuple[int, float]] = field(default_factory=dict)
    # What `choose_victims` reads of a job, for those it found no victims for while the
    # free capacity stayed as it is (cleared on admission, like `shortage_memo`).
    no_victims: set[tuple[object, ...]] = field(default_factory=set)
    leaving: list[JobView] | None = None  # holders already preempting (built once)
    tries_left: int = 0  # blocked jobs behind the reservation that may still make room
    # Free plus what `leaving` holds that no job has claimed (built at the first look)
    leaving_room: FreePool | None = None
    leaving_left: dict[str, Capacity] = field(default_factory=dict)  # that part, by node
    # Gangs preempted beside the reservation whose early exit its future capacity counts
    returned: set[int] = field(default_factory=set)
    touched: set[int] = field(default_factory=set)  # holders preempted or resized this pass
    protected: float | None = None  # `protection_ratio` of the job being decided
    # Backfill off, no reservations: the first blocked job that can ever start (its index
    # in decisions), which every later job waits behind
    first_blocked: int | None = None


def schedule(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    now: datetime,
    config: PolicyConfig | None = None,
    *,
    queues: Mapping[str, QueueQuota] | None = None,
    usage: Mapping[tuple[str, str], float] | None = None,
    waiting: Mapping[int, Sequence[Upstream]] | None = None,
) -> list[Decision]:
    """One pass: one Admit or Wait per pending job, in queue order, plus the Preempt and
    Resize decisions that make room. `queues`: quotas by queue name (missing: no
    guarantee, no limit, weight 1). `usage`: recent decayed GPU-seconds by (queue, user),
    for fair share between queues (over their weights) and users (`fairshare.decayed_usage`).
    `waiting`: pending jobs held for other jobs (`dependencies.settle`), with the upstream
    jobs they wait for: they take no place in the queue and wait last, for those jobs."""
    config = config or PolicyConfig()
    quotas = queues or {}
    holders = [j for j in jobs if j.state in RESOURCE_HOLDING_STATES]
    releases = release_timeline(holders, now, config)
    state = _Pass(
        now=now,
        config=config,
        free=FreePool.of_nodes(
            _free_now(snapshot, releases),
            snapshot.nodes,
            speed_aware=config.speed_aware_placement,
        ),
        holders=holders,
        releases=releases,
        node_gpus=max((node.num_gpus for node in snapshot.nodes), default=0),
        etas_left=config.eta_jobs,
        tries_left=config.preemption_tries,
        queues=quotas,
        limits={q: quota.max_gpus for q, quota in quotas.items() if quota.max_gpus is not None},
        queue_used=gpus_by_queue(holders),
        borrowed=borrowing_jobs(holders, quotas),
    )
    held = waiting or {}
    pending = [j for j in jobs if j.state is JobState.PENDING and j.id not in held]
    on_hold = [j for j in pending if j.hold is not None]
    if on_hold:
        pending = [j for j in pending if j.hold is None]
    weights = {name: quota.weight for name, quota in quotas.items()}
    protected: dict[int, float] = {}  # job id -> wait over predicted run time
    ordered = queue_order(
        pending, now, config, usage, weights, protected_out=protected, node_gpus=state.node_gpus
    )
    for position, job in enumerate(ordered, start=1):
        if protected:
            state.protected = protected.get(job.id)
        _decide(state, job, position)
    if config.elastic_resize:
        _grow_elastic(state)
    _fill_rough_etas(state)
    if held:
        by_id = {j.id: j for j in jobs}
        state.decisions += dependency_waits(held, by_id, state.decisions, now, config)
    state.decisions += [_held(job) for job in on_hold]
    return state.decisions


def _held(job: JobView) -> Wait:
    """A job on hold waits for its release, whatever the cluster looks like."""
    return Wait(job.id, Explanation(Blocker.HOLD, f"held: {job.hold}", "starts once released"))


def _free_now(snapshot: ClusterSnapshot, releases: Sequence[Release]) -> dict[str, Capacity]:
    """Alive capacity minus what every holder uses (each release carries that usage)."""
    free = total_capacity(snapshot.nodes)
    for release in releases:
        for node_id, cap in release.capacity.items():
            if node_id in free:
                free[node_id] = free[node_id].minus(cap.gpus, cap.cpus)
    return free


def _decide(state: _Pass, job: JobView, position: int) -> None:
    dp_min = job.shape.dp_min
    smallest = job if dp_min is None else _at_dp(job, dp_min)
    capped = job.queue in state.limits  # uncapped queues skip the call: this runs per job
    limit = over_limit(smallest, state.queue_used, state.queues) if capped else None
    if limit is not None:  # cannot start whatever the cluster looks like: holds no reservation
        unblock = f"starts when jobs of queue {job.queue!r} end"
        why = Explanation(Blocker.QUOTA, limit, unblock)
        state.decisions.append(Wait(job.id, why, protected=state.protected))
        return
    if state.first_blocked is not None and state.reservation is None:
        _wait_in_order(state, job, state.first_blocked)
        return
    if state.reservation is not None:
        room = max(state.free.total_gpus, state.spare.total_gpus if state.spare else 0)
        if smallest.shape.num_gpus > room:  # fast path: a long queue behind a full cluster
            _blocked(state, smallest, None)
            return
    sizes = _sizes_to_try(state, job)
    placement = None
    for sized in sizes:
        if state.spare is not None:
            spot = place_gang(sized.shape, state.spare)
            if spot is not None:  # on GPUs the reserved job will not need: harmless
                _admit(state, sized, spot, position)
                return
        if state.reservation is None:  # nothing to protect: place and take in one go
            placement = place_gang(sized.shape, state.free, keep=True)
            if placement is not None:
                _admit(state, sized, placement, position, taken=True)
                return
            continue
        placement = place_gang(sized.shape, state.free)
        if placement is not None and _harmless(state, sized, placement):
            _admit(state, sized, placement, position)
            return
    tried_smallest = sizes and sizes[-1].shape.parallelism.dp == smallest.shape.parallelism.dp
    if not tried_smallest:  # an elastic job whose small sizes were skipped unplaced
        placement = place_gang(smallest.shape, state.free)
    _blocked(state, smallest, placement)


def _blocked(state: _Pass, job: JobView, placement: Placement | None) -> None:
    """`job` cannot start now (`placement`: where it would fit but for the reservation).
    The first such job takes the reservation; a later one may make room beside it."""
    if state.reservation is None:
        _reserve(state, job, placement)
    elif placement is not None or state.tries_left <= 0 or not _make_room_beside(state, job):
        _wait(state, job, placement)  # (tries_left checked first: once spent, most jobs)


def _at_dp(job: JobView, dp: int) -> JobView:
    return job if dp == job.shape.parallelism.dp else replace(job, shape=job.shape.with_dp(dp))


def _sizes_to_try(state: _Pass, job: JobView) -> list[JobView]:
    """An elastic job tries the largest degree first, down to its minimum; degrees that
    the free GPUs or the queue's limit cannot hold are skipped without a placement."""
    shape = job.shape
    if shape.dp_min is None:
        return [job]
    replica_gpus = shape.replica_ranks * shape.gpus_per_rank
    room = state.free.total_gpus
    limit = state.limits.get(job.queue)
    if limit is not None:
        room = min(room, limit - state.queue_used.get(job.queue, 0))
    top = min(shape.parallelism.dp, room // replica_gpus)
    return [_at_dp(job, dp) for dp in range(top, shape.dp_min - 1, -1)]


# -- admission -----------------------------------------------------------------------------


def _admit(
    state: _Pass, job: JobView, placement: Placement, position: int, *, taken: bool = False
) -> None:
    """Take the resources now (unless the placement already did) and put their expected
    return on the timeline, so later reservations and estimates account for this job."""
    used = usage(job.shape, placement)
    if not taken:
        state.free.take_all(used)
    state.shortage_memo.clear()  # the free capacity it describes has changed
    state.no_victims.clear()
    if state.leaving_room is not None:
        state.leaving_room.take_all(used)
    state.queue_used[job.queue] = state.queue_used.get(job.queue, 0) + job.shape.num_gpus
    ends = state.now + timedelta(seconds=expected_runtime_s(job, state.config))
    reservation = state.reservation
    if reservation is not None:
        _refresh_spare(state, reservation, used)
        if ends > reservation.at:
            for node_id, cap in used.items():
                reservation.future[node_id] = reservation.future[node_id].minus(cap.gpus, cap.cpus)
    bisect.insort(state.releases, Release(ends, job.id, used, job.shape.num_gpus))
    if reservation is None:
        reason = f"queue position {position}; {job.shape.num_gpus} GPUs free on {len(used)} node(s)"
    else:
        reason = (
            f"backfilled at queue position {position} on {len(used)} node(s) without "
            f"delaying job {reservation.job.id}'s reserved start"
        )
    if state.protected is not None:
        reason = f"{protection_note(state.protected)}; {reason}"
    state.decisions.append(Admit(job.id, placement, reason))


def _harmless(
    state: _Pass,
    job: JobView,
    placement: Placement,
    gone: Sequence[JobView] = (),
    starts: datetime | None = None,
) -> bool:
    """Does starting `job` (now, or at `starts`) leave the reserved job's planned
    placement intact? True if it ends before the reserved time, or if every node it uses
    keeps what the reserved placement needs there (a sufficient check, O(nodes used)).
    `gone`: gangs that will have left by then (they are being preempted): what they hold
    counts as free at the reserved time where the timeline expected them past it."""
    reservation = state.reservation
    if reservation is None:
        return True
    if not state.config.backfill:
        return False
    ends = (starts or state.now) + timedelta(seconds=expected_runtime_s(job, state.config))
    if ends <= reservation.at:
        return True
    returned = _held_by(_returning_early(state, gone))
    for node_id, cap in usage(job.shape, placement).items():
        left = reservation.future[node_id].minus(cap.gpus, cap.cpus)
        if node_id in returned:
            left = left.plus(returned[node_id])
        need = reservation.needed.get(node_id, NOTHING)
        if not left.fits(need.gpus, need.cpus):
            return False
    return True


# -- the reservation -----------------------------------------------------------------------


def _reserve(state: _Pass, job: JobView, placement: Placement | None) -> None:
    """The first job that cannot start now: make room by preemption, or reserve its start."""
    if placement is None and _room_is_coming(state, job):
        return
    if placement is None and state.config.elastic_resize and _shrink_for(state, job):
        return
    if placement is None and state.config.preemption and _preempt_for(state, job):
        return
    if not _may_reserve(state, job):
        _wait_unreserved(state, job)
        return
    start = earliest_start(job.shape, state.free, state.releases, state.now)
    if start is not None and start.at > state.now:
        start = _sparing_the_free(state, job, start)
    if start is None:
        why = _never_on_alive_nodes(state, job)
        state.decisions.append(Wait(job.id, why, protected=state.protected))
        return
    _set_reservation(state, job, start)
    explanation = _explain_blocked(state, job, start)
    state.decisions.append(Wait(job.id, explanation, start.at, True, state.protected))


def _wait_unreserved(state: _Pass, job: JobView) -> None:
    """`job` waits without holding GPUs. The first `eta_jobs` such jobs get the earliest
    start of their shape on the timeline; every one is estimated by GPU count as well
    once the walk is over (when the GPUs released cover it and every job blocked ahead
    of it), and the later of the two stands. Jobs that rank higher and arrive later, or
    that fit sooner, may still take the GPUs first: nothing is held."""
    held = (
        "none are held for it: jobs of less attained service, or that fit sooner, may take "
        "them first"
        if not state.config.reservations
        else "having run before, it holds no reservation until protected"
    )
    strict = not state.config.backfill and not state.config.reservations
    start = None
    if state.etas_left > 0 or strict:  # strict: the job every later one waits behind
        state.etas_left = max(0, state.etas_left - 1)
        start = earliest_start(job.shape, state.free, state.releases, state.now)
        if start is None:
            why = _never_on_alive_nodes(state, job)
            state.decisions.append(Wait(job.id, why, protected=state.protected))
            return
    if strict:
        state.first_blocked = len(state.decisions)
    state.blocked_gpus += job.shape.num_gpus
    state.rough_etas.append((len(state.decisions), state.blocked_gpus, None))
    if start is None:
        why = _explain_shortage(state, job.shape, f"starts when enough GPUs are free ({held})")
    else:
        why = _explain_blocked(state, job, start, f" ({held})")
    state.decisions.append(Wait(job.id, why, start.at if start else None, False, state.protected))


def _wait_in_order(state: _Pass, job: JobView, head: int) -> None:
    """Backfill off and no reservations: no job starts past the first blocked one (the
    decision at `head`), and none is estimated to start before it."""
    state.blocked_gpus += job.shape.num_gpus
    state.rough_etas.append((len(state.decisions), state.blocked_gpus, head))
    first = state.decisions[head].job_id
    why = Explanation(
        Blocker.RESERVATION,
        f"backfill is off: no job starts ahead of job {first}, which cannot start yet",
        f"starts once job {first} has started",
        first,
    )
    state.decisions.append(Wait(job.id, why, protected=state.protected))


def _sparing_the_free(state: _Pass, job: JobView, start: Start) -> Start:
    """The same reserved time on GPUs that running gangs release by then, where they hold
    the job on no more racks: the GPUs free now and those that preempted gangs are
    freeing stay usable by the jobs behind the reservation (backfill, and a job that
    preempted beside it: had the reservation taken the room its victims left, that
    preemption would be wasted). On a cluster of several GPU types the placement stays
    as found (it chose the type)."""
    if state.free.mixed:
        return start
    leaving = {gang.id for gang in _leaving(state)}
    released = state.free.without(state.free.as_dict())  # every node, nothing free
    future = state.free.copy()  # at the reserved time: every release up to it, ties too
    for release in state.releases:
        if release.at > start.at:
            break
        future.give_all(release.capacity)
        if release.job_id not in leaving:
            released.give_all(release.capacity)
    placement = place_gang(job.shape, released)
    if placement is None or _racks(state, placement) > _racks(state, start.placement):
        return start
    return Start(start.at, placement, future.as_dict())


def _racks(state: _Pass, placement: Placement) -> int:
    return len({state.free.rack_of(node_id) for node_id in placement.node_ids})


def _may_reserve(state: _Pass, job: JobView) -> bool:
    """A protected job holds the reservation, with `reservations` on or off: without it
    a large job could wait forever while smaller ones take every GPU that frees (the
    bound would not bound). Otherwise only with `reservations` on, and only a job that
    has not run before: GPUs left idle for one that least attained service preempted
    would undo that preemption."""
    if protected(job, state.now, state.config):
        return True
    return state.config.reservations and job.attained_gpu_s <= 0


def _set_reservation(state: _Pass, job: JobView, start: Start) -> None:
    needed = usage(job.shape, start.placement)
    state.blocked_gpus += job.shape.num_gpus
    state.reservation = _Reservation(job, start.at, start.placement, dict(start.free), needed)
    if state.config.backfill:
        state.spare = state.free.without(needed)


def _refresh_spare(state: _Pass, reservation: _Reservation, used: dict[str, Capacity]) -> None:
    if state.spare is None:
        return
    for node_id in used:
        free = state.free.get(node_id)
        if free is not None:
            need = reservation.needed.get(node_id, NOTHING)
            left = Capacity(max(0, free.gpus - need.gpus), max(0.0, free.cpus - need.cpus))
            state.spare.set(node_id, left)


def _room_is_coming(state: _Pass, job: JobView) -> bool:
    """Gangs already preempting free enough for this job: wait for them, take no more."""
    leaving = _leaving(state)
    if not leaving:
        return False
    deadline = max(expected_end(h, state.now, state.config) for h in leaving)
    return _hold_room(
        state,
        job,
        leaving,
        deadline,
        message=f"waiting for preempted job(s) {_ids(leaving)} to checkpoint and exit",
        once="they have gone",
    )


def _hold_room(
    state: _Pass,
    job: JobView,
    gangs: Sequence[JobView],
    deadline: datetime,
    *,
    message: str,
    once: str,
) -> bool:
    """Hold for `job` the room that `gangs` leave by `deadline`, if it holds the job."""
    capacity = freed_by(state.free, gangs)
    placement = place_gang(job.shape, capacity)
    if placement is None:
        return False
    _hold_for(state, job, Start(deadline, placement, capacity.as_dict()), message, once)
    return True


def _hold_for(state: _Pass, job: JobView, start: Start, message: str, once: str) -> None:
    """Reserve `start` for `job` while other gangs make room for it, and say so; its GPUs
    count for its queue from now (limits and reclaim for the jobs after it see them)."""
    _set_reservation(state, job, start)
    state.queue_used[job.queue] = state.queue_used.get(job.queue, 0) + job.shape.num_gpus
    explanation = Explanation(
        Blocker.PREEMPTING, message, f"starts when {once} (by {start.at:%H:%M:%S} UTC)"
    )
    state.decisions.append(Wait(job.id, explanation, start.at, True, state.protected))


def _ids(jobs: Sequence[JobView]) -> str:
    return ", ".join(str(j.id) for j in jobs)


def _preempt_for(state: _Pass, job: JobView) -> bool:
    """The first blocked job: make it fit by preempting lower-ranked gangs, and hold the
    room they leave as the pass's reservation."""
    victims = _victims_for(state, job)
    if not victims:
        return False
    deadline = _preempt(state, job, victims)
    held = _hold_room(
        state,
        job,
        victims,
        deadline,
        message=f"preempting lower-priority job(s) {_ids(victims)} to make room",
        once="they have checkpointed",
    )
    assert held  # choose_victims guarantees the fit
    return True


def _make_room_beside(state: _Pass, job: JobView) -> bool:
    """A blocked job behind the reservation that outranks running gangs preempts them
    too, where the room they leave holds it without delaying the reserved start
    (`_harmless`, from the victims' deadline on). Without this only one blocked job per
    pass could preempt: short jobs queued behind a large reserved one waited for it while
    lower-ranked gangs held GPUs the reserved job would never use. First, gangs already
    preempting whose room would hold it: it waits for them and takes no more. A victim
    search walks the pass's victim pool up to the first gang that ranks no lower than
    the job: only the first `preemption_tries` blocked jobs behind the reservation make
    one per pass."""
    config = state.config
    if not (config.preemption and config.backfill) or state.tries_left <= 0:
        return False  # without backfill nothing may start beside the reservation
    state.tries_left -= 1
    if _room_leaving(state, job):
        return True
    victims = _victims_for(state, job)
    if not victims:
        return False
    deadline = state.now + timedelta(seconds=config.checkpoint_grace_s)
    placement = place_gang(job.shape, freed_by(state.free, victims))
    if placement is None or not _harmless(state, job, placement, victims, deadline):
        return False
    _preempt(state, job, victims)
    _claim(state, job, placement, victims, deadline)
    _wait_beside(state, job, victims, deadline, "preempting lower-priority job(s) {} to make room")
    return True


def _room_leaving(state: _Pass, job: JobView) -> bool:
    """Gangs already preempting leave room that holds `job` beside the reservation: it
    waits for them and takes no more (and the room it takes is not counted again for the
    jobs after it in the pass)."""
    leaving = _leaving(state)
    if not leaving:
        return False
    if state.leaving_room is None:
        state.leaving_room = freed_by(state.free, leaving)
        state.leaving_left = _held_by(leaving)
    if job.shape.num_gpus > state.leaving_room.total_gpus:
        return False
    placement = place_gang(job.shape, state.leaving_room)
    if placement is None:
        return False
    deadline = max(expected_end(h, state.now, state.config) for h in leaving)
    if not _harmless(state, job, placement, leaving, deadline):
        return False
    _claim(state, job, placement, leaving, deadline, in_room=True)
    _wait_beside(state, job, leaving, deadline, "preempted job(s) {} to checkpoint and exit")
    return True


def _held_by(gangs: Iterable[JobView]) -> dict[str, Capacity]:
    held: dict[str, Capacity] = {}
    for gang in gangs:
        if gang.placement is not None:
            for node_id, cap in usage(gang.shape, gang.placement).items():
                held[node_id] = held.get(node_id, NOTHING).plus(cap)
    return held


def _claim(
    state: _Pass,
    job: JobView,
    placement: Placement,
    gangs: Sequence[JobView],
    starts: datetime,
    *,
    in_room: bool = False,
) -> None:
    """`job` will start on `placement` at `starts`, once `gangs` have gone. It takes what
    it needs of their GPUs first (`in_room`: gangs already preempting, shared by the jobs
    waiting for them: only what no one has claimed), the rest from the GPUs free now, at
    once, so no later job of the pass counts on them; the reservation's future capacity
    gains what the gangs held past its time and loses what the job will hold past it;
    its GPUs count for its queue (limits and reclaim see them)."""
    left = state.leaving_left if in_room else _held_by(gangs)
    taken: dict[str, Capacity] = {}
    from_free: dict[str, Capacity] = {}
    used = usage(job.shape, placement)
    for node_id, cap in used.items():
        there = left.get(node_id, NOTHING)
        gpus, cpus = min(cap.gpus, there.gpus), min(cap.cpus, there.cpus)
        left[node_id] = there.minus(gpus, cpus)
        taken[node_id] = Capacity(gpus, cpus)
        if cap.gpus > gpus or cap.cpus > cpus:
            from_free[node_id] = cap.minus(gpus, cpus)
    if state.leaving_room is not None:  # free plus unclaimed leaving room: keep it so
        state.leaving_room.take_all(from_free)
        if in_room:
            state.leaving_room.take_all(taken)
    if from_free:
        state.free.take_all(from_free)
        state.shortage_memo.clear()  # the free capacity it describes has changed
    reservation = state.reservation
    if reservation is not None:
        if from_free:
            _refresh_spare(state, reservation, from_free)
        future = reservation.future
        early = _returning_early(state, gangs)
        state.returned.update(gang.id for gang in early)
        for node_id, cap in _held_by(early).items():
            future[node_id] = future[node_id].plus(cap)
        if starts + timedelta(seconds=expected_runtime_s(job, state.config)) > reservation.at:
            for node_id, cap in used.items():
                future[node_id] = future[node_id].minus(cap.gpus, cap.cpus)
    state.queue_used[job.queue] = state.queue_used.get(job.queue, 0) + job.shape.num_gpus


def _returning_early(state: _Pass, gangs: Sequence[JobView]) -> list[JobView]:
    """Those of `gangs` (being preempted) that the timeline expected to hold their GPUs
    past the reserved time, and whose exit the reservation does not count yet."""
    reservation = state.reservation
    if reservation is None:
        return []
    return [
        gang
        for gang in gangs
        if gang.placement is not None
        and gang.id not in state.returned
        and expected_end(gang, state.now, state.config) > reservation.at
    ]


def _wait_beside(
    state: _Pass, job: JobView, gangs: Sequence[JobView], deadline: datetime, doing: str
) -> None:
    held = state.reservation
    assert held is not None
    message = f"{doing.format(_ids(gangs))}, beside the room held for job {held.job.id}"
    unblock = f"starts when they have gone (by {deadline:%H:%M:%S} UTC)"
    explanation = Explanation(Blocker.PREEMPTING, message, unblock)
    state.decisions.append(Wait(job.id, explanation, deadline, False, state.protected))


def _leaving(state: _Pass) -> list[JobView]:
    if state.leaving is None:
        state.leaving = [h for h in state.holders if h.state is JobState.PREEMPTING]
    return state.leaving


def _victims_for(state: _Pass, job: JobView) -> list[JobView] | None:
    """The gangs `choose_victims` would stop for `job` (None: none would do)."""
    if state.victim_pool is None:
        holders = [h for h in state.holders if h.id not in state.touched]
        state.victim_pool, state.ranks = victim_pool(
            holders, state.now, state.config, state.borrowed, node_gpus=state.node_gpus
        )
    if not state.victim_pool:
        return None
    reclaim = within_guarantee(job, state.queue_used, state.queues)
    # Everything choose_victims reads of the job (its queue only to reclaim, its
    # prediction only for the payoff rule): another blocked job that matches it in these,
    # with the free capacity and the victim pool unchanged, gets the same answer.
    reads = (
        job.priority,
        rank(job, state.now, state.config),
        job.queue if reclaim else None,
        job.shape,
        job.predicted_remaining_s if state.config.preemption_payoff else None,
    )
    if reads in state.no_victims:
        return None
    victims = choose_victims(
        job,
        state.free,
        state.victim_pool,
        state.now,
        state.config,
        borrowed=state.borrowed,
        reclaim=reclaim,
        ranks=state.ranks,
    )
    if not victims:
        state.no_victims.add(reads)
    return victims


def _preempt(state: _Pass, job: JobView, victims: Sequence[JobView]) -> datetime:
    """Preempt `victims` for `job`; they leave the pass's victim pool (no later job of
    the pass counts on them again). Returns their deadline to checkpoint and exit."""
    deadline = state.now + timedelta(seconds=state.config.checkpoint_grace_s)
    for victim in victims:
        why = _why_preempted(state, job, victim)
        reason = (
            f"preempted for job {job.id} ({why}); checkpoint and exit by {deadline:%H:%M:%S} UTC"
        )
        state.decisions.append(Preempt(victim.id, job.id, deadline, reason))
    _touch(state, victims)
    return deadline


def _touch(state: _Pass, gangs: Iterable[JobView]) -> None:
    """`gangs` are preempted or resized in this pass: no later job counts on them again."""
    ids = {gang.id for gang in gangs}
    state.touched |= ids
    if state.victim_pool is not None:
        state.victim_pool.drop(ids)


def _why_preempted(state: _Pass, job: JobView, victim: JobView) -> str:
    if victim.priority < job.priority:
        return f"priority {job.priority} > {victim.priority}"
    if rank(victim, state.now, state.config) < rank(job, state.now, state.config):
        ratio = protection_ratio(job, state.now, state.config)
        if ratio is not None:
            return f"same priority {job.priority}; job {job.id} is {protection_note(ratio)}"
        if state.config.service_order == "srsf":
            return (
                f"same priority {job.priority}; job {victim.id} has "
                f"{remaining_gpu_s(victim) / 3600:.1f} GPU-hours of predicted service left, "
                f"job {job.id} {remaining_gpu_s(job) / 3600:.1f} (shortest remaining first)"
            )
        used_h = attained_gpu_s(victim, state.now) / 3600
        return (
            f"same priority {job.priority}; job {victim.id} has used {used_h:.1f} GPU-hours, "
            f"job {job.id} {attained_gpu_s(job, state.now) / 3600:.1f} (least attained "
            "service first)"
        )
    return f"queue {job.queue!r} reclaims GPUs that queue {victim.queue!r} borrowed"


# -- elastic jobs --------------------------------------------------------------------------


def _resizable(state: _Pass) -> list[JobView]:
    return [
        h
        for h in state.holders
        if h.state is JobState.RUNNING and h.shape.elastic and h.placement is not None
    ]


def _shrink_for(state: _Pass, job: JobView) -> bool:
    """Give `job` room by taking replicas from running elastic jobs of no higher priority
    (lowest priority and most replicas above minimum first), before any preemption."""
    candidates = sorted(
        (
            h
            for h in _resizable(state)
            if h.priority <= job.priority
            and h.shape.dp_min is not None
            and h.shape.parallelism.dp > h.shape.dp_min
        ),
        key=lambda h: (h.priority, -(h.shape.parallelism.dp - (h.shape.dp_min or 0)), h.id),
    )
    pool = state.free.copy()
    plan: dict[int, tuple[JobView, int]] = {}
    placement = None
    for victim in candidates:
        assert victim.placement is not None and victim.shape.dp_min is not None
        replicas = replica_nodes(victim.shape, victim.placement)
        rank = Capacity(victim.shape.gpus_per_rank, victim.shape.cpus_per_rank)
        for dp in range(victim.shape.parallelism.dp - 1, victim.shape.dp_min - 1, -1):
            for node_id in replicas[dp]:
                pool.give(node_id, rank)
            plan[victim.id] = (victim, dp)
            placement = place_gang(job.shape, pool)
            if placement is not None:
                break
        if placement is not None:
            break
    if placement is None:
        return False
    for victim_id in list(plan)[:-1]:  # spare shrinks the room does not need (other types)
        rest = {k: v for k, v in plan.items() if k != victim_id}
        spared = place_gang(job.shape, _freed_by_shrinks(state.free, rest.values()))
        if spared is not None:
            plan, placement = rest, spared
    pool = _freed_by_shrinks(state.free, plan.values())
    deadline = state.now + timedelta(seconds=state.config.checkpoint_grace_s)
    for victim, dp in plan.values():
        assert victim.placement is not None
        reason = (
            f"shrunk from dp={victim.shape.parallelism.dp} to dp={dp} to make room for "
            f"job {job.id}, before preempting any whole gang"
        )
        state.decisions.append(
            Resize(victim.id, shrunk(victim.shape, victim.placement, dp), dp, reason)
        )
    _touch(state, [victim for victim, _ in plan.values()])
    _hold_for(
        state,
        job,
        Start(deadline, placement, pool.as_dict()),
        f"shrinking elastic job(s) {_ids([v for v, _ in plan.values()])} to make room",
        "they have resized",
    )
    return True


def _freed_by_shrinks(free: FreePool, plan: Iterable[tuple[JobView, int]]) -> FreePool:
    """A copy of `free` plus the replicas each (job, new dp) of `plan` gives up."""
    pool = free.copy()
    for victim, dp in plan:
        assert victim.placement is not None
        replicas = replica_nodes(victim.shape, victim.placement)
        rank = Capacity(victim.shape.gpus_per_rank, victim.shape.cpus_per_rank)
        for gone in replicas[dp:]:
            for node_id in gone:
                pool.give(node_id, rank)
    return pool


def _grow_elastic(state: _Pass) -> None:
    """After the queue had its turn: give idle GPUs to running elastic jobs below their
    maximum, highest priority first, one replica at a time, never into reserved GPUs.

    A grow restarts the group, so it must pay for itself: the predicted time saved on
    the rest of the run (remaining x (1 - dp / new dp), perfect scaling) must exceed the
    restart's cost (`checkpoint_grace_s` + `restart_cost_s`). And while other jobs are
    expected to free GPUs within `resize_lookahead_s`, a job that could use them waits to
    grow once, then, instead of growing now and again in a moment."""
    resized = {d.job_id for d in state.decisions if isinstance(d, Resize | Preempt)}
    growable = [
        h
        for h in _resizable(state)
        if h.id not in resized
        and h.shape.dp_max is not None
        and h.shape.parallelism.dp < h.shape.dp_max
    ]
    soon = state.now + timedelta(seconds=state.config.resize_lookahead_s)
    for job in sorted(growable, key=lambda h: (-h.priority, h.id)):
        assert job.placement is not None and job.shape.dp_max is not None
        pool = (state.spare or state.free).copy()
        one = pool.on_types_of(job.shape.with_dp(1), job.placement)
        extra: list[str] = []
        for _ in range(job.shape.dp_max - job.shape.parallelism.dp):
            spot = place_gang(one, pool)
            if spot is None:
                break
            pool.take_all(usage(one, spot))
            extra.extend(spot.node_ids)
        if not extra:
            continue
        grown_to = job.shape.parallelism.dp + len(extra) // job.shape.replica_ranks
        if not _grow_pays(state, job, grown_to, soon):
            continue
        used = usage(one, Placement(tuple(extra)))
        state.free.take_all(used)
        if state.spare is not None:
            state.spare.take_all(used)
        placement = grown(job.shape, job.placement, Placement(tuple(extra)))
        reason = f"grown from dp={job.shape.parallelism.dp} to dp={grown_to} onto idle GPUs"
        state.decisions.append(Resize(job.id, placement, grown_to, reason))


def _grow_pays(state: _Pass, job: JobView, grown_to: int, soon: datetime) -> bool:
    dp_max = job.shape.dp_max
    if grown_to < (dp_max or 0) and any(
        r.at <= soon and r.job_id != job.id and r.at > state.now for r in state.releases
    ):
        return False  # more GPUs are coming: grow once, when they are here
    remaining_s = (expected_end(job, state.now, state.config) - state.now).total_seconds()
    saved_s = remaining_s * (1 - job.shape.parallelism.dp / grown_to)
    return saved_s > state.config.checkpoint_grace_s + state.config.restart_cost_s


# -- waiting and explaining ----------------------------------------------------------------


def _wait(state: _Pass, job: JobView, placement: Placement | None) -> None:
    reservation = state.reservation
    assert reservation is not None
    eta = _estimate_start(state, reservation, job)
    if placement is not None:
        explanation = Explanation(
            Blocker.RESERVATION,
            f"fits now, but would delay the start reserved for job {reservation.job.id} "
            f"at {reservation.at:%Y-%m-%d %H:%M:%S} UTC",
            "starts when it can run without delaying that job (a time limit short enough "
            "to end before then lets it start now)",
            reservation.job.id,
        )
    elif eta is None:
        explanation = _explain_queued(state, job, reservation.job.id)
        # estimated by GPU count once the walk is over and the timeline is complete
        state.rough_etas.append(
            (len(state.decisions), state.blocked_gpus + job.shape.num_gpus, reservation.at)
        )
    else:
        explanation = _explain_blocked(state, job, eta)
    state.blocked_gpus += job.shape.num_gpus
    state.decisions.append(
        Wait(job.id, explanation, eta.at if eta else None, False, state.protected)
    )


def _fill_rough_etas(state: _Pass) -> None:
    """Every pending job gets an estimated start. Beyond the first `eta_jobs` blocked jobs
    (placed exactly on the timeline) it is a GPU-count estimate: the time when the GPUs
    released by running jobs cover this job plus every blocked job ahead of it, node
    shape ignored, not before the reserved start for a job behind the reservation, nor
    before the first blocked job's estimate for one held behind it (backfill off); a
    job that holds nothing keeps the later of that and its exact estimate.
    O(pending x log running); None past the last expected release."""
    if not state.rough_etas:
        return
    released = (r.gpus for r in state.releases)
    covered = list(itertools.accumulate(released, initial=state.free.total_gpus))[1:]
    for index, needed, after in state.rough_etas:
        slot = bisect.bisect_left(covered, needed)
        if slot < len(covered):
            wait = state.decisions[index]
            assert isinstance(wait, Wait)
            floor = after if isinstance(after, datetime) else state.now
            head = state.decisions[after] if isinstance(after, int) else None
            if isinstance(head, Wait) and head.estimated_start_at is not None:
                floor = max(floor, head.estimated_start_at)
            eta = max(state.releases[slot].at, floor, wait.estimated_start_at or floor)
            state.decisions[index] = wait.estimated(eta)


def _estimate_start(state: _Pass, reservation: _Reservation, job: JobView) -> Start | None:
    """Conservative ETA: on the release timeline, with the reserved job holding its
    placement from now on. Only the first `eta_jobs` blocked jobs get one (cost bound)."""
    if state.etas_left <= 0:
        return None
    state.etas_left -= 1
    free = state.free.copy()
    free.take_all(reservation.needed)
    start = earliest_start(job.shape, free, state.releases, state.now, scratch=True)
    if start is None or start.at >= reservation.at:
        return start
    return Start(reservation.at, start.placement, start.free)


def _explain_blocked(state: _Pass, job: JobView, start: Start, note: str = "") -> Explanation:
    when = f"{start.at:%Y-%m-%d %H:%M:%S} UTC"
    upto = bisect.bisect_right(state.releases, start.at, key=lambda r: r.at)
    freeing = [r.job_id for r in state.releases[max(0, upto - 3) : upto]]
    by = (
        f"; job(s) {', '.join(map(str, freeing))} are expected to free GPUs by then"
        if freeing
        else ""
    )
    return _explain_shortage(state, job.shape, f"expected to start at {when}{by}{note}")


def _explain_queued(state: _Pass, job: JobView, behind: int) -> Explanation:
    """Memoized per pass: a long queue holds many jobs of the same shape, and the free
    capacity only changes when a job is admitted (which clears the memo)."""
    shape = job.shape
    group = shape.ranks_per_group * shape.gpus_per_rank
    key = (shape.num_gpus, group, shape.gpu_types, shape.mix_gpu_types, behind)
    explanation = state.shortage_memo.get(key)
    if explanation is None:
        explanation = _explain_shortage(state, shape, f"queued behind job {behind}")
        state.shortage_memo[key] = explanation
    return explanation


def _explain_shortage(state: _Pass, shape: GangShape, unblock: str) -> Explanation:
    pool, need = state.free, shape.num_gpus
    if pool.total_gpus < need:
        return Explanation(
            Blocker.CLUSTER_FULL, f"needs {need} GPUs; {pool.total_gpus} free now", unblock
        )
    kinds = pool.choices(shape)
    if None in kinds:
        free, largest, of_types = pool.total_gpus, pool.largest_gpus(), ""
    else:  # only some GPUs will do: those of its types, one type at a time unless mixed
        if all(pool.type_gpus([k]) < need for k in kinds):
            return _explain_types(state, shape, kinds, unblock)
        free = max(pool.type_gpus([k]) for k in kinds)
        largest, of_types = max(pool.largest_gpus(k) for k in kinds), " of a type it may use"
    group = shape.ranks_per_group * shape.gpus_per_rank
    return Explanation(
        Blocker.NODE_SHAPE,
        f"needs {shape.num_ranks // shape.ranks_per_group} block(s) of {group} GPUs on one "
        f"node; {free} GPUs{of_types} are free but the largest free block is {largest}",
        unblock,
    )


def _explain_types(
    state: _Pass, shape: GangShape, kinds: Sequence[Kind], unblock: str
) -> Explanation:
    """Enough GPUs are free, but the gang may use only some of them: those of the types
    it names, or (unmixed) those of one type at a time."""
    pool = state.free
    names = sorted({n for k in kinds for n in ([k] if isinstance(k, str) else k or ())})
    one_type = "" if shape.mix_gpu_types else " of one type"
    if not names:  # the types it names are on no alive node
        asked = "/".join(sorted(shape.gpu_types or ()))
        message = f"needs {shape.num_gpus} GPUs of type {asked}; no alive node has that type"
        return Explanation(Blocker.GPU_TYPE, message, "starts when nodes of its type come back")
    free_by_type = ", ".join(f"{n or 'unknown'} {pool.type_gpus([n])}" for n in names)
    return Explanation(
        Blocker.GPU_TYPE,
        f"needs {shape.num_gpus} GPUs{one_type} ({'/'.join(n or 'unknown' for n in names)}); "
        f"free now by type: {free_by_type} ({pool.total_gpus} free in all)",
        unblock,
    )


def _never_on_alive_nodes(state: _Pass, job: JobView) -> Explanation:
    shape = job.shape
    kinds = state.free.choices(shape)
    if shape.gpu_types is not None:
        where = f" of type {'/'.join(sorted(shape.gpu_types))}"
    elif None not in kinds and not shape.mix_gpu_types:
        where = " of one GPU type (resources.mix_gpu_types lets it span types)"
    else:
        where = ""
    return Explanation(
        Blocker.GPU_TYPE if where else Blocker.NODE_SHAPE,
        f"needs {shape.num_gpus} GPUs{where} in blocks of {shape.ranks_per_group} ranks; the "
        "alive nodes cannot hold it even when every running job has ended",
        "starts when enough nodes come back",
    )
