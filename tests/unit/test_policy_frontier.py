"""bench/policy_frontier.py's perturbed traces and its baseline cache keys: a seed moves
submit times the same way every time, and no two trials share a cached baseline."""

from __future__ import annotations

from pathlib import Path

from bench.policy_frontier import _cache_path, _perturbed
from scheduler.sim.policies import POLICIES
from scheduler.sim.trace import TraceJob

TRACE = [TraceJob(i, 10.0 * i, 1 + i % 4, 600.0) for i in range(50)]


def test_seed_zero_is_the_trace_as_given() -> None:
    assert _perturbed(TRACE, 0, 300.0) is TRACE


def test_a_seed_delays_each_submit_by_less_than_the_jitter_the_same_way_each_time() -> None:
    moved = _perturbed(TRACE, 3, 300.0)
    assert moved == _perturbed(TRACE, 3, 300.0)
    assert moved != _perturbed(TRACE, 4, 300.0)
    by_id = {job.job_id: job for job in moved}
    assert sorted(by_id) == [job.job_id for job in TRACE]
    for job in TRACE:
        delay = by_id[job.job_id].submit_s - job.submit_s
        assert 0.0 <= delay < 300.0
        assert by_id[job.job_id].num_gpus == job.num_gpus
    assert [job.submit_s for job in moved] == sorted(job.submit_s for job in moved)


def test_every_trial_has_its_own_cached_baseline(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpu,duration\n0,1,60\n")
    las = POLICIES["tiresias"]
    keys = {
        _cache_path(tmp_path, (trace, nodes, las, seed, jitter))
        for nodes in (2, 3)
        for seed in (0, 1, 2)
        for jitter in (300.0, 600.0)
        if seed or jitter == 300.0  # seed 0 ignores the jitter: the trace as given
    }
    assert len(keys) == 2 * (1 + 2 * 2)
    same = _cache_path(tmp_path, (trace, 2, las, 0, 600.0))
    assert same == _cache_path(tmp_path, (trace, 2, las, 0, 300.0))
    assert _cache_path(tmp_path, (trace, 2, POLICIES["fifo"], 1, 300.0)) not in keys
