"""A discrete-event simulator that drives `scheduler.core.schedule` with a simulated clock.

Work model: a job needs `duration_s` of run time on its full gang. A run makes progress from
its start (after `restore_s` when it resumes from a checkpoint); progress is checkpointed
every `checkpoint_interval_s`. A preempted job keeps its GPUs for `checkpoint_save_s`
(stopping), loses the progress since its last checkpoint, and queues again. On a cluster of
several GPU types (`node_types`), a run progresses at its slowest GPU's speed (a
synchronous gang waits for it): `duration_s` is the run time at speed 1.

What the policy sees is what a real cluster knows: the time limit users declared (the
trace's duration x `time_limit_factor`, when given), and progress so far with its step
time (one step = one second of work). The true remaining work is shown only with `oracle`.

Scheduling passes run when something happened (arrival, end, release) and, while jobs
wait under a policy whose decisions change with time alone (aging, preemption: a victim
reaching a checkpoint, a service band sinking), every `wait_tick_s` (the service's loop
passes every second; 300 s still lands in every window of `service_preemption_loss_s`
after a checkpoint); at most once per `tick_s` of simulated time.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from scheduler.core import Admit, PolicyConfig, Preempt, schedule
from scheduler.core.fairshare import HALF_LIFE_S, UsageInterval, decayed_usage
from scheduler.core.gittins import GittinsTable
from scheduler.model import (
    ClusterSnapshot,
    JobState,
    JobView,
    Node,
    Placement,
    RunInfo,
)
from scheduler.predict.gpu_speeds import speeds_for
from scheduler.predict.runtime import JobFeatures, RuntimePredictor
from scheduler.sim.jobs import EPOCH, Phase, Sample, SimConfig, SimJob, SimResult, shape_for
from scheduler.sim.policies import NEVER_S, SimPolicy
from scheduler.sim.trace import TraceJob

_JOB_STATE = {  # what the core sees of a job that has arrived and not ended
    Phase.WAITING: JobState.PENDING,
    Phase.RUNNING: JobState.RUNNING,
    Phase.STOPPING: JobState.PREEMPTING,
}


class _Event(enum.IntEnum):  # order of processing at one instant
    END = 0
    RELEASE = 1
    ARRIVAL = 2
    PASS = 3


class Simulator:
    def __init__(
        self, trace: list[TraceJob], config: SimConfig, policy: SimPolicy, *, eta_jobs: int = 0
    ) -> None:
        """`eta_jobs`: how many blocked jobs per pass get an exact start estimate from the
        core. The simulator reads only Admit and Preempt decisions, so by default it asks
        for none (each costs a timeline search per blocked job and changes no decision)."""
        self.config = config
        self.policy = policy
        types = [name for name, count in config.node_types for _ in range(count)]
        speeds = speeds_for(types, dict(config.gpu_speeds))
        self.nodes = tuple(
            Node(
                f"n{i:05d}",
                f"node-{i}",
                config.gpus_per_node,
                8.0 * config.gpus_per_node,
                rack=f"r{i // config.nodes_per_rack}" if config.nodes_per_rack else None,
                gpu_type=types[i] if types else None,
                gpu_speed=speeds[types[i]] if types else 1.0,
            )
            for i in range(config.nodes)
        )
        self._speed_of = {node.id: node.gpu_speed for node in self.nodes}
        self.jobs = [
            SimJob(t, shape_for(t.num_gpus, config.gpus_per_node, config.placement)) for t in trace
        ]
        # Events and decisions name jobs by trace id: any ids, not only positions (a
        # caller's trace, or one re-sorted after its submit times moved).
        self._by_id = {job.trace.job_id: job for job in self.jobs}
        if len(self._by_id) != len(self.jobs):
            raise ValueError("the trace's job ids must be unique")
        self._events: list[tuple[float, int, int, int, int]] = []
        self._sequence = itertools.count()
        self._last_pass_s = -float("inf")
        self._next_pass_s: float | None = None  # the earliest pass queued, if any
        self._active: dict[int, SimJob] = {}  # arrived and not done, in arrival order
        self._usage: dict[tuple[str, str], float] = {}
        # Does time alone change this policy's decisions (aging, victims reaching a
        # checkpoint, sinking service bands)? Then waiting jobs get a pass every tick.
        self._timed = policy.config.preemption or policy.config.aging_interval_s < NEVER_S
        self.samples: list[Sample] = []
        self.passes = 0
        self.predictor = RuntimePredictor()
        self._service_gpu_s: list[float] = []  # finished jobs' GPU-seconds: Gittins' prior
        self._prior_size = 0  # how many of them the current table was built from
        self._config = replace(policy.config, eta_jobs=eta_jobs)
        self._policy_config = self._config

    # -- running ----------------------------------------------------------------------

    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate until every job ended; `progress(jobs_done)` is called as jobs end."""
        for job in self.jobs:
            self._push(job.trace.submit_s, _Event.ARRIVAL, job.trace.job_id)
        done = 0
        now = 0.0
        while self._events:
            now, kind, _, job_id, version = heapq.heappop(self._events)
            if kind == _Event.PASS:
                if now == self._next_pass_s:  # else superseded by an earlier one
                    self._next_pass_s = None
                    self._pass(now)
                continue
            job = self._by_id[job_id]
            if kind == _Event.ARRIVAL:
                self._active[job_id] = job
                job.queued_s = now
                job.predicted_s = self.predictor.runtime_s(job.features)
            elif kind == _Event.END and version == job.version and job.phase is Phase.RUNNING:
                self._finish(job, now)
                done += 1
                if progress:
                    progress(done)
            elif kind == _Event.RELEASE and job.phase is Phase.STOPPING:
                job.phase, job.placement, job.queued_s = Phase.WAITING, None, now
            else:
                continue  # a stale end: the run it ended was preempted
            self._request_pass(now)
        return SimResult(
            self.policy.name,
            self.jobs,
            sum(n.num_gpus for n in self.nodes),
            now,
            self.samples,
            self.passes,
        )

    def _push(self, at: float, kind: _Event, job_id: int = -1, version: int = 0) -> None:
        heapq.heappush(self._events, (at, int(kind), next(self._sequence), job_id, version))

    def _request_pass(self, now: float, after_s: float = 0.0) -> None:
        at = max(now + after_s, self._last_pass_s + self.config.tick_s)
        if self._next_pass_s is None or at < self._next_pass_s:
            self._next_pass_s = at
            self._push(at, _Event.PASS)

    # -- one scheduling pass -----------------------------------------------------------

    def _pass(self, now: float) -> None:
        if self.policy.fair_share:  # the only reader of the usage
            self._decay_usage(now)
        self._last_pass_s = now
        self.passes += 1
        predicted: dict[tuple[JobFeatures, float], float | None] = {}  # for this pass
        views = [self._view(job, now, predicted) for job in self._active.values()]
        decisions = schedule(
            ClusterSnapshot(self.nodes),
            views,
            EPOCH + timedelta(seconds=now),
            self._config_with_prior(),
            usage=self._usage if self.policy.fair_share else None,
        )
        for decision in decisions:
            job = self._by_id[decision.job_id]
            if isinstance(decision, Admit):
                self._start(job, decision.placement, now)
            elif isinstance(decision, Preempt):
                self._preempt(job, now)
        busy = queued = 0
        for job in self._active.values():
            if job.placement is not None:
                busy += job.shape.num_gpus
            elif job.phase is Phase.WAITING:
                queued += 1
        self.samples.append(Sample(now, busy, queued))
        if queued and self._timed and self._events:  # with nothing left to happen, a
            self._request_pass(now, self.config.wait_tick_s)  # waiting job never fits

    def _config_with_prior(self) -> PolicyConfig:
        """The policy, with a Gittins table of the finished jobs' service when it orders
        by Gittins index; rebuilt when the prior grew by 5% (each build is O(jobs))."""
        config = self._config
        finished = len(self._service_gpu_s)
        if config.service_order != "gittins" or not finished:
            return config
        if finished >= self._prior_size * 1.05 + 1:
            self._prior_size = finished
            table = GittinsTable(self._service_gpu_s)
            self._policy_config = replace(config, gittins=table)
        return self._policy_config

    def _decay_usage(self, now: float) -> None:
        """Recent GPU-seconds per (queue, user), decayed with `fairshare.HALF_LIFE_S`,
        updated incrementally: the usage of the last pass decays over the time since, and
        `fairshare.decayed_usage` (the service's measure) adds the runs of that window."""
        elapsed = now - self._last_pass_s if self._last_pass_s > -float("inf") else 0.0
        if elapsed <= 0:
            return
        factor = 2 ** (-elapsed / HALF_LIFE_S)
        for key in self._usage:
            self._usage[key] *= factor
        window = [
            UsageInterval(
                job.trace.queue,
                job.trace.queue,
                job.shape.num_gpus,
                EPOCH + timedelta(seconds=max(self._last_pass_s, job.run_start_s)),
                None,
            )
            for job in self._active.values()
            if job.phase is Phase.RUNNING
        ]
        for key, used in decayed_usage(window, EPOCH + timedelta(seconds=now), HALF_LIFE_S).items():
            self._usage[key] = self._usage.get(key, 0.0) + used

    def _view(
        self, job: SimJob, now: float, predicted: dict[tuple[JobFeatures, float], float | None]
    ) -> JobView:
        remaining = self._predicted_remaining_s(job, now, predicted)
        if job.phase is Phase.WAITING:  # unchanged while it waits, unless these change
            inputs = (job.queued_s, job.attained_gpu_s, remaining)
            cached = job.waiting_view
            if cached is not None and cached[0] == inputs:
                return cached[1]
        factor = self.config.time_limit_factor
        view = JobView(
            id=job.trace.job_id,
            priority=0,
            submitted_at=job.submitted_at,
            state=_JOB_STATE[job.phase],
            shape=job.shape,
            placement=job.placement,
            time_limit_s=job.trace.duration_s * factor if factor else None,
            run=self._run_info(job, now) if job.placement is not None else None,
            queue=job.trace.queue,
            user=job.trace.queue,
            attained_gpu_s=job.attained_gpu_s,
            queued_at=EPOCH + timedelta(seconds=job.queued_s),
            predicted_remaining_s=remaining,
        )
        if job.phase is Phase.WAITING:
            job.waiting_view = (inputs, view)
        return view

    def _predicted_remaining_s(
        self, job: SimJob, now: float, predicted: dict[tuple[JobFeatures, float], float | None]
    ) -> float | None:
        """Run time still ahead of the job: the truth with `oracle`, else the predictor's
        estimate given the progress made so far (None: unknown). `predicted` memoizes
        the predictor within one pass (it learns only between passes)."""
        done = job.saved_s + (job.progress_s(now, self.config.restore_s) if job.placement else 0)
        speed = job.speed if job.placement else 1.0  # a waiting job's: at speed 1
        if self.config.oracle:
            return max(0.0, job.trace.duration_s - done) / speed
        key = (job.features, done)
        if key in predicted:
            total = predicted[key]
        else:
            total = predicted[key] = self.predictor.runtime_s(job.features, done)
        return None if total is None else max(0.0, total - done) / speed

    def _run_info(self, job: SimJob, now: float) -> RunInfo:
        progress = job.progress_s(now, self.config.restore_s)
        remaining = job.trace.duration_s - job.saved_s
        since_checkpoint = progress % self.config.checkpoint_interval_s
        return RunInfo(
            started_at=EPOCH + timedelta(seconds=job.run_start_s),
            step=int(progress),
            total_steps=int(remaining) if self.config.oracle else None,
            step_time_s=1.0 / job.speed if progress > 0 else None,
            steps_since_checkpoint=int(since_checkpoint),
        )

    # -- applying decisions -------------------------------------------------------------

    def _start(self, job: SimJob, placement: Placement, now: float) -> None:
        job.phase, job.placement, job.run_start_s = Phase.RUNNING, placement, now
        job.speed = min(self._speed_of[node_id] for node_id in placement.node_ids)
        job.runs += 1
        job.waited_s += now - job.queued_s
        if job.first_start_s is None:
            job.first_start_s = now
        job.version += 1
        warmup = self.config.restore_s if job.runs > 1 else 0.0
        ends = now + warmup + (job.trace.duration_s - job.saved_s) / job.speed
        self._push(ends, _Event.END, job.trace.job_id, job.version)

    def _preempt(self, job: SimJob, now: float) -> None:
        """Stop making progress now; keep the GPUs while stopping; lose what the last
        periodic checkpoint did not save."""
        progress = job.progress_s(now, self.config.restore_s)
        kept = progress - progress % self.config.checkpoint_interval_s
        job.saved_s += kept
        lost_s = (progress - kept) / job.speed + self.config.checkpoint_save_s
        job.lost_gpu_s += lost_s * job.shape.num_gpus
        job.attained_gpu_s += (now - job.run_start_s) * job.shape.num_gpus
        job.preemptions += 1
        job.phase = Phase.STOPPING
        job.version += 1  # its end event is void
        self._push(now + self.config.checkpoint_save_s, _Event.RELEASE, job.trace.job_id)

    def _finish(self, job: SimJob, now: float) -> None:
        job.attained_gpu_s += (now - job.run_start_s) * job.shape.num_gpus
        self.predictor.observe(job.features, job.trace.duration_s)
        self._service_gpu_s.append(job.trace.duration_s * job.trace.num_gpus)
        job.phase, job.placement, job.finish_s = Phase.DONE, None, now
        del self._active[job.trace.job_id]
