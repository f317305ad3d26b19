"""Policy knobs, validated at construction (principle 9)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.gittins import GittinsTable

SERVICE_ORDERS = ("las", "gittins", "srsf")


@dataclass(frozen=True)
class PolicyConfig:
    """Defaults: the service-level ones were chosen on the simulator's traces (BENCHMARKS.md
    gives the figures); the others are reasoned guesses.

    aging_interval_s: a pending job gains one priority point per interval waited, or per
        `age_per_runs` x its predicted run time if that is longer, and ranks with the
        highest priority class queued that it has reached: aging lifts a job into a
        higher class, never above the jobs of its own (waiting alone does not turn least
        attained service back into FIFO; within a class `starvation_s` bounds waits).
        Bound: a job of priority p waiting behind newly submitted jobs of priority q > p
        ranks with them after q - p such intervals, and is then a job of their class
        (ahead of the newer ones of its service band, and of its gang size with
        `larger_gangs_first`, which it entered earlier).
    age_per_runs: aging paced by the job's own cost: one point per this many predicted
        run times waited (its slowdown), when longer than `aging_interval_s`: a short job
        climbs quickly, a long one slowly. Predicted run time: the time run so far plus
        the predicted remaining run time (else the time limit); a job with neither ages
        by `aging_interval_s` alone.
    min_runtime_s: a job that has run for less than this is never a preemption victim
        (no thrashing).
    checkpoint_grace_s: how long a victim has to checkpoint and exit before its
        resources are taken.
    default_runtime_s: the runtime assumed for a job with no time limit and no measured
        progress yet (conservative: a long guess protects reservations).
    eta_jobs: how many blocked jobs, in queue order, get an estimated start placed exactly
        on the release timeline per pass (each costs a search over it); later ones get a
        GPU-count estimate that ignores node shape.
    elastic_resize: grow running elastic jobs onto idle GPUs and shrink them toward their
        minimum before preempting whole gangs. Off, elastic jobs still start at the
        largest degree that fits, and keep it.
    reservations: the first job that cannot start holds a reservation that backfill must
        respect (EASY), unless it has run before (it has GPU time attained: least
        attained service preempted it): GPUs left idle for it would undo that
        preemption. Off (the default), only a protected job holds one (see
        `starvation_s`); any other blocked job holds nothing (greedy backfill, as
        Tiresias) and makes room for itself by preemption, each in turn until one holds
        the room it made, then `preemption_tries` more; blocked jobs get estimated starts
        either way. On the traces a held reservation drains GPUs that least attained
        service would give to short jobs: 2D-LAS with this default's rules against lost
        work met the four goals against 2D-LAS on 8 of 11 traces (seed 0), with EASY
        reservations added on 5 (BENCHMARKS.md).
    preemption_tries: how many blocked jobs behind the reservation (the first ones in
        queue order) may make room per pass, by preemption or by waiting for gangs
        already preempting (a search walks the pass's victim pool, cheapest first, up to
        the first gang that ranks no lower). The first blocked job always may; a later
        one only where the room it takes, from the victims' deadline on, leaves the
        reserved start intact; what it counts on is then no longer free to the jobs
        after it in the pass.
    service_levels_gpu_s: least-attained-service levels, ascending GPU-seconds. Within
        one priority, a job that has consumed fewer GPU-seconds ranks first and may
        preempt jobs that have passed more levels (Tiresias' discretised 2D-LAS: short
        jobs, most of every trace, finish without waiting behind long ones). Empty: off.
    starvation_s: a job queued this long, and `protect_after_runs` x its predicted run
        time, is protected: it is promoted to the top service band (it may then preempt
        sunk jobs of its priority), ranks ahead of every unprotected job of its aged
        priority (the longest queued first, so the reservation, which a protected job
        holds with `reservations` on or off, goes to the job that has waited longest
        past its bound), and its next run counts service afresh, so
        least-attained-service cannot starve long jobs. Its decisions say so ("protected:
        waited 3.1x its predicted run time").
    protect_after_runs: the wait, in predicted run times, after which a job is protected
        (when longer than `starvation_s`): waits are bounded relative to what the job
        costs, so long jobs do not crowd the protected set while short ones wait.
    service_preemption_loss_s: a job is preempted for service (same priority, less GPU
        time attained) only while it would lose at most this many seconds of work since
        its last checkpoint; priority and quota preemption ignore it.
    service_order: how service ranks jobs within a priority. "las": the discretised
        least-attained-service bands above. "gittins": the same bands, and within a band
        the higher Gittins index of attained service under `gittins` (a prior learned
        from finished jobs) first (Tiresias' 2D-Gittins). "srsf": shortest remaining
        GPU service first (predicted remaining run time x GPUs; unknown last), preemptive:
        the lower bound when predictions are exact.
    shortest_predicted_first: within a band, jobs with less predicted remaining GPU
        service go first (unknown predictions after known ones). Off by default: on the
        traces it moved average JCT to 0.83-1.01x 2D-LAS's but the longest waits to up
        to 1.97x, past 2D-LAS's tail on most traces (BENCHMARKS.md).
    larger_gangs_first: within a service band (after its Gittins or predicted order,
        where one is configured), a gang that needs more GPUs (an elastic one: at its
        dp_min) goes before a smaller one; fair share then orders the gangs of one size.
        The pass considers it first: it takes GPUs as they free before the small jobs
        behind it split them up, and when it cannot start it is the first blocked job,
        which makes room for itself by preemption; small jobs still start on what is
        left (greedy backfill). Behind them a large gang starts only in a pass where a
        whole node is free and no small job took it first. With `service_levels_gpu_s`
        empty (one band) it orders the whole priority class.
    smaller_victims_first: among preemption victims of one rank, a gang that needs fewer
        GPUs (an elastic one: at its dp_min) is stopped before a larger one, then the
        one losing the least work. A stopped gang queues again and must find as many
        GPUs free at once: an 8-GPU gang just past its checkpoint loses no more work
        than a 1-GPU one, but it waits for a whole node to restart.
        Both rules count a gang's GPUs up to the cluster's largest node (`gang_size`):
        gangs of a node or more wait alike for whole nodes. Counted in full, the rules
        sided with the few gangs larger than a node against the many one-node jobs: on
        ITP cluster04 the one-node jobs carried all of the added JCT (stopped first,
        restarted last), average JCT 1.26-1.35x 2D-LAS's. Both off by default: capped,
        together they meet issue 30's four goals on 21 of 33 shared-trace runs and 5 of
        12 held-out runs, the default on 22 and 5 (BENCHMARKS.md).
    preemption_payoff: a preemption for service happens only when it pays for itself:
        the victim's predicted remaining run time exceeds the newcomer's by more than the
        cost of stopping and resuming (`checkpoint_grace_s` + `restart_cost_s` + the work
        lost since its checkpoint). Unknown predictions count as long. Off by default:
        a job whose prediction overshoots waits behind every victim predicted to end
        sooner (BENCHMARKS.md at d10421f: ITP cluster10, average JCT 1.13x 2D-LAS's).
    restart_cost_s: a resumed (or resized) run's warm-up before it makes progress again.
    resize_lookahead_s: an elastic job does not grow while other jobs are expected to
        free GPUs within this window; it grows once, when they have (each grow restarts).
    gittins: the Gittins table for "gittins" order (rebuilt by the caller as jobs end).
    speed_aware_placement: on a cluster of several GPU types, a gang goes on the fastest
        type it allows that holds it now (nodes carry their type's relative speed). Off
        (type-blind, the simulator's baseline), a job that names no types goes anywhere.
    """

    aging_interval_s: float = 3600.0
    min_runtime_s: float = 600.0
    checkpoint_grace_s: float = 120.0
    default_runtime_s: float = 24 * 3600.0
    eta_jobs: int = 50
    backfill: bool = True
    preemption: bool = True
    elastic_resize: bool = True
    reservations: bool = False
    preemption_tries: int = 16
    service_levels_gpu_s: tuple[float, ...] = (3600.0, 36_000.0)
    starvation_s: float = 7 * 24 * 3600.0
    protect_after_runs: float = 8.0
    age_per_runs: float = 2.0
    service_preemption_loss_s: float = 300.0
    service_order: str = "las"
    shortest_predicted_first: bool = False
    larger_gangs_first: bool = False
    smaller_victims_first: bool = False
    preemption_payoff: bool = False
    restart_cost_s: float = 60.0
    resize_lookahead_s: float = 120.0
    gittins: GittinsTable | None = field(default=None, compare=False, repr=False)
    speed_aware_placement: bool = True

    def __post_init__(self) -> None:
        for name in ("aging_interval_s", "default_runtime_s", "starvation_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in (
            "min_runtime_s",
            "checkpoint_grace_s",
            "eta_jobs",
            "preemption_tries",
            "service_preemption_loss_s",
            "protect_after_runs",
            "age_per_runs",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.service_order not in SERVICE_ORDERS:
            raise ValueError(f"service_order must be one of {', '.join(SERVICE_ORDERS)}")
        if self.restart_cost_s < 0 or self.resize_lookahead_s < 0:
            raise ValueError("restart_cost_s and resize_lookahead_s must be >= 0")
        levels = self.service_levels_gpu_s
        if any(level <= 0 for level in levels) or list(levels) != sorted(set(levels)):
            raise ValueError("service_levels_gpu_s must be positive and strictly ascending")
