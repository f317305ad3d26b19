"""The invariants every fault case ends with, checked and printed the same way each time
(Jepsen's checkers in spirit: what must hold whatever failed):

1. no submission lost: every job the test submitted is still there;
2. exactly once: every job is terminal or active, and Ray runs at most one attempt of
   it, the one the store calls current (never two attempts running);
3. nothing stranded: no Gangway placement group or rank actor on Ray without an active
   (job, attempt) in the store (found by name in Ray's GCS, no handle needed);
4. GPUs accounted: the GPUs the store says active gangs hold equal the GPUs Gangway's
   placement groups reserve on Ray;
5. steps lost <= the checkpoint interval: from the ledger `checkpointed_steps` keeps (a
   resume redoes at most `every` steps, and the steps of one run follow each other: no
   two attempts ever counted at once).

Only REST, Ray's GCS and the checkpoint directory are read, so the same checker runs
against any version of the service.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.placement_group import placement_group_table

from gangway import Client, GangwayError, JobInfo, JobState

# States in which a job's gang may legitimately hold a placement group on Ray.
HOLDING = {"ADMITTED", "STARTING", "RUNNING", "PREEMPTING", "RESIZING"}
_NAME = re.compile(r"gangway-job(\d+)-attempt(\d+)(?:-rank\d+)?")


@dataclass
class Report:
    checked: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"  ok: {line}" for line in self.checked]
        lines += [f"  VIOLATION: {line}" for line in self.violations]
        return "invariants:\n" + "\n".join(lines)


def gangway_on_ray() -> tuple[set[tuple[int, int]], dict[tuple[int, int], float]]:
    """(job, attempt) of every live Gangway actor or placement group, and the GPUs each
    attempt's placement group reserves (created groups only)."""
    attempts: set[tuple[int, int]] = set()
    gpus: dict[tuple[int, int], float] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if (match := _NAME.fullmatch(entry["name"])) is not None:
            attempts.add((int(match[1]), int(match[2])))
    for entry in placement_group_table().values():
        match = _NAME.fullmatch(entry.get("name") or "")
        if match is None or entry.get("state") == "REMOVED":
            continue
        key = (int(match[1]), int(match[2]))
        attempts.add(key)
        if entry.get("state") == "CREATED":
            bundles = entry.get("bundles", {}).values()
            gpus[key] = gpus.get(key, 0.0) + sum(b.get("GPU", 0.0) for b in bundles)
    return attempts, gpus


def ledger_violations(path: Path, every: int) -> tuple[int, list[str]]:
    """The most steps any resume redid, and what in the ledger breaks the rules."""
    if not path.exists():
        return 0, []
    problems: list[str] = []
    reached = 0  # the highest step any run counted
    expected: int | None = None  # the step the current run counts next
    worst = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        kind, _, value = line.partition(" ")
        step = int(value)
        if kind == "resume":
            worst = max(worst, reached - step)
            if reached - step > every:
                problems.append(f"{path.parent.name}: resumed at {step} after {reached}")
            expected = step + 1
        else:
            if step != expected:
                problems.append(
                    f"{path.parent.name} ledger line {number}: step {step}, expected {expected} "
                    "(two runs counting at once?)"
                )
            expected = step + 1
            reached = max(reached, step)
    return worst, problems


def violations(
    client: Client, job_ids: Iterable[int], checkpoints: Path | None, every: int
) -> Report:
    report = Report()
    jobs: list[JobInfo] = []
    for job_id in job_ids:
        try:
            jobs.append(client.get(job_id))
        except GangwayError as exc:
            report.violations.append(f"job {job_id} lost: {exc}")
    report.checked.append(f"{len(jobs)} submitted job(s) all present")
    active = {(j.id, j.attempt) for j in jobs if j.state.value in HOLDING}
    on_ray, reserved = gangway_on_ray()
    for job in jobs:
        attempts = sorted(a for j, a in on_ray if j == job.id)
        if len(attempts) > 1:
            report.violations.append(f"job {job.id}: attempts {attempts} all on Ray at once")
        elif attempts and (job.id, attempts[0]) not in active:
            report.violations.append(
                f"job {job.id} is {job.state.value} at attempt {job.attempt}, but Ray runs "
                f"attempt {attempts[0]}"
            )
    known = {j.id for j in jobs}
    strays = sorted(key for key in on_ray - active if key[0] not in known)
    if strays:
        report.violations.append(f"Gangway gangs on Ray that no job owns: {strays}")
    if not report.violations:
        states = ", ".join(f"{j.id}:{j.state.value}@{j.attempt}" for j in jobs)
        report.checked.append(f"each job terminal or active, its attempt alone on Ray ({states})")
    db_gpus = sum(j.num_gpus for j in jobs if j.state.value in HOLDING)
    ray_gpus = sum(reserved.values())
    if db_gpus != ray_gpus:
        report.violations.append(f"GPUs held: {db_gpus} in the store, {ray_gpus:g} on Ray")
    else:
        report.checked.append(f"GPUs held: {db_gpus} in the store = {ray_gpus:g} on Ray")
    if checkpoints is not None:
        worst = 0
        for job in jobs:
            lost, problems = ledger_violations(checkpoints / f"job-{job.id}" / "ledger", every)
            worst = max(worst, lost)
            report.violations.extend(problems)
        report.checked.append(f"steps lost at most {worst} (checkpoint interval {every})")
    return report


def check(
    client: Client,
    job_ids: Iterable[int],
    *,
    checkpoints: Path | None = None,
    every: int = 5,
    settle_s: float = 30.0,
) -> Report:
    """Check until every invariant holds or `settle_s` passes (reaping and freeing are
    asynchronous), print the report, and fail the test on any violation."""
    ids = list(job_ids)
    deadline = time.monotonic() + settle_s
    while True:
        report = violations(client, ids, checkpoints, every)
        if not report.violations or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    print(report)
    assert not report.violations, str(report)
    return report


def finished(client: Client, job_ids: Iterable[int], timeout_s: float = 180) -> list[JobInfo]:
    """Wait for every job to reach a terminal state."""
    ids = list(job_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        jobs: list[JobInfo] = [client.get(i) for i in ids]
        if all(j.state.is_terminal for j in jobs) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Check a service on another Ray cluster than this process's (the emulated hosts'):
    connect to its head as a driver, check, print; 1 on a violation."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--ray-address", required=True, help="the cluster's head, host:port")
    parser.add_argument("--url", required=True, help="the service's URL")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--job", type=int, action="append", required=True, dest="jobs")
    parser.add_argument("--settle-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    ray.init(address=args.ray_address, logging_level="ERROR", log_to_driver=False)
    try:
        check(Client(args.url, api_key=args.api_key), args.jobs, settle_s=args.settle_s)
    except AssertionError:
        return 1
    finally:
        ray.shutdown()
    return 0


__all__ = ["JobState", "Report", "check", "finished", "gangway_on_ray", "violations"]

if __name__ == "__main__":
    raise SystemExit(main())
