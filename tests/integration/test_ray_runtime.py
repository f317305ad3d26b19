"""Worker groups on a real local Ray with two logical GPU nodes (one shared cluster)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from scheduler.runtime.gangs.group import GroupSpec, WorkerGroup
from scheduler.runtime.gangs.status import GroupPhase, GroupStatus
from workers.launch import BuiltinRun, FunctionRun, JobLaunch, Run, ScriptRun

pytestmark = pytest.mark.ray


def spec(job_id: int, node_ids: list[str], run: Run, **launch: Any) -> GroupSpec:
    """A gang of one rank per node id, one GPU each, running `run` as user `test`."""
    return GroupSpec(
        node_ids=tuple(node_ids),
        gpus_per_rank=1,
        cpus_per_rank=1.0,
        dp=len(node_ids),
        tp=1,
        pp=1,
        launch=JobLaunch(job_id=job_id, attempt=1, user="test", run=run, **launch),
    )


def poll_until(group: WorkerGroup, phases: set[GroupPhase], timeout_s: float = 120) -> GroupStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = group.poll()
        if status.phase in phases:
            return status
        time.sleep(0.2)
    raise AssertionError(f"group still {group.poll()} after {timeout_s} s")


def run_to_end(group_spec: GroupSpec) -> GroupStatus:
    """Launch a group, wait until it ends, tear it down; its final status."""
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    try:
        return poll_until(group, {GroupPhase.SUCCEEDED, GroupPhase.FAILED})
    finally:
        group.teardown()


def free_gpus() -> float:
    return float(ray.available_resources().get("GPU", 0.0))


def wait_for_free_gpus(expected: float, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while free_gpus() != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert free_gpus() == expected


def test_ranks_run_on_the_chosen_nodes_and_all_reduce(gpu_node_ids: list[str]) -> None:
    first, second = gpu_node_ids
    placement = [second, first, second]
    run = FunctionRun(target="workers.examples:allreduce_ranks", kwargs={"steps": 2})
    group = WorkerGroup.launch(spec(101, placement, run), placement_timeout_s=60)
    try:
        assert (
            poll_until(group, {GroupPhase.SUCCEEDED, GroupPhase.FAILED}).phase
            is GroupPhase.SUCCEEDED
        )
    finally:
        group.teardown()
    wait_for_free_gpus(8.0)


def test_function_entrypoints_get_a_device_mesh(gpu_node_ids: list[str]) -> None:
    first, second = gpu_node_ids
    group_spec = replace(
        spec(
            107,
            [first, first, second, second],
            FunctionRun(target="workers.examples:check_mesh"),
        ),
        dp=2,
        tp=2,
    )
    status = run_to_end(group_spec)
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    wait_for_free_gpus(8.0)


def test_builtin_trainer_dp2_lowers_the_loss(gpu_node_ids: list[str]) -> None:
    run = BuiltinRun(fields={"model": "gpt-tiny", "steps": 40, "batch_size": 8})
    group = WorkerGroup.launch(spec(102, gpu_node_ids, run), placement_timeout_s=60)
    try:
        running = poll_until(group, {GroupPhase.RUNNING})
        assert running.ranks_started
        status = poll_until(group, {GroupPhase.SUCCEEDED, GroupPhase.FAILED})
    finally:
        group.teardown()
    assert status.phase is GroupPhase.SUCCEEDED, status.error
    assert status.step == 40
    assert status.loss is not None and status.loss < math.log(256) - 1.0
    assert status.first_loss is not None and abs(status.first_loss - math.log(256)) < 0.3
    assert status.tokens_per_s is not None and status.tokens_per_s > 0


def test_a_user_exception_fails_the_gang_with_its_traceback(gpu_node_ids: list[str]) -> None:
    run = FunctionRun(
        target="workers.examples:fail_on_rank", kwargs={"rank": 1, "message": "boom from rank 1"}
    )
    status = run_to_end(spec(103, gpu_node_ids, run))
    assert status.phase is GroupPhase.FAILED
    assert status.error is not None
    assert "rank 1 failed" in status.error
    assert "RuntimeError: boom from rank 1" in status.error


def test_an_unmodified_torchrun_script_runs_as_two_ranks(gpu_node_ids: list[str]) -> None:
    """PyTorch's DDP tutorial script on gloo (see its docstring for the one addition)."""
    script = Path(__file__).parents[2] / "examples" / "ddp_tutorial.py"
    status = run_to_end(spec(104, gpu_node_ids, ScriptRun(path=str(script))))
    assert status.phase is GroupPhase.SUCCEEDED, status.error


def test_a_failing_script_fails_the_gang_with_its_output(
    gpu_node_ids: list[str], tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)  # a host script's folder is read by the job's uid, not root
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, sys\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'],"
        " 'local', os.environ['LOCAL_RANK'], 'of', os.environ['LOCAL_WORLD_SIZE'])\n"
        "sys.exit(3)\n"
    )
    status = run_to_end(spec(105, gpu_node_ids, ScriptRun(path=str(script))))
    assert status.phase is GroupPhase.FAILED
    assert status.error is not None
    assert "crash.py exited with code 3" in status.error
    assert "of 2 local 0 of 1" in status.error  # one rank on each node


def test_a_hung_group_shows_every_ranks_stack(gpu_node_ids: list[str]) -> None:
    run = FunctionRun(target="workers.examples:hang_at_step")
    group = WorkerGroup.launch(spec(106, gpu_node_ids, run), placement_timeout_s=60)
    try:
        deadline = time.monotonic() + 60
        while group.poll().step < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        stacks = group.stacks()
    finally:
        group.teardown()
    assert "=== rank 0 ===" in stacks and "=== rank 1 ===" in stacks
    assert stacks.count("in hang_at_step") == 2  # each rank's entrypoint thread, where it is
    wait_for_free_gpus(8.0)


def test_a_dead_rank_fails_the_gang_names_its_node_and_keeps_the_last_lines(
    gpu_node_ids: list[str],
) -> None:
    run = FunctionRun(target="workers.examples:hang_at_step")
    group_spec = spec(107, gpu_node_ids, run)  # rank i on node i
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    lines: list[tuple[int, str]] = []  # every poll's new lines, as the service keeps them

    def poll() -> GroupStatus:
        status = group.poll()
        lines.extend((rank, line) for rank, _, line in status.logs)
        return status

    try:
        deadline = time.monotonic() + 60
        while poll().step < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # rank 0 prints "reached step 3" after reporting it; no poll fetches it
        ray.kill(ray.get_actor(f"{group_spec.name}-rank1", namespace="gangway"))
        deadline = time.monotonic() + 30
        while (status := poll()).phase is not GroupPhase.FAILED and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        group.teardown()
    assert status.phase is GroupPhase.FAILED
    assert "a rank's actor died" in (status.error or "")
    assert status.lost_nodes == (gpu_node_ids[1],)
    assert (0, "rank 0 reached step 3") in lines
    wait_for_free_gpus(8.0)


def test_a_new_driver_reattaches_to_a_running_group(gpu_node_ids: list[str]) -> None:
    run = FunctionRun(target="workers.examples:sleep_steps", kwargs={"steps": 600})
    group_spec = spec(104, gpu_node_ids[:1] * 2, run)
    group = WorkerGroup.launch(group_spec, placement_timeout_s=60)
    poll_until(group, {GroupPhase.RUNNING})
    attached = WorkerGroup.attach(group_spec)
    assert attached is not None
    status = poll_until(attached, {GroupPhase.RUNNING})
    assert status.ranks_started
    attached.teardown()
    assert WorkerGroup.attach(group_spec) is None
    wait_for_free_gpus(8.0)


def test_a_placement_ray_cannot_satisfy_times_out_and_holds_nothing(
    gpu_node_ids: list[str],
) -> None:
    run = BuiltinRun(fields={"model": "gpt-tiny", "steps": 1})
    too_many = spec(105, gpu_node_ids[:1] * 5, run)  # 5 GPUs pinned to a 4-GPU node
    group = WorkerGroup.launch(too_many, placement_timeout_s=1.0)
    status = poll_until(group, {GroupPhase.PLACEMENT_TIMEOUT}, timeout_s=10)
    assert "could not reserve" in (status.error or "")
    group.teardown()
    wait_for_free_gpus(8.0)


def test_attach_reaps_a_half_launched_group(gpu_node_ids: list[str]) -> None:
    """A service killed between reserving the placement and starting the ranks leaves a
    detached placement group behind; attaching finds it incomplete and frees it."""
    run = BuiltinRun(fields={"model": "gpt-tiny", "steps": 1})
    group_spec = spec(106, gpu_node_ids, run)
    WorkerGroup.launch(group_spec, placement_timeout_s=60)  # no poll: actors never created
    wait_for_free_gpus(6.0)
    assert WorkerGroup.attach(group_spec) is None
    wait_for_free_gpus(8.0)
