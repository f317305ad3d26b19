"""Calibration runs: a few short built-in jobs whose measured step times fit the
step-time model of the node type they ran on (`scheduler.predict.steptime.calibrate`).

A fresh service knows nothing of its nodes' speed: its estimates price the plan's FLOPs
and bytes at assumed speeds, whose error is unknown. The runs measure the real ones:
different models, batch sizes and plans (data and tensor parallel where a node has two
devices), so each term of the model (compute, bytes sent, messages, per-step cost) is
pinned by a run that leans on it. They are ordinary jobs of `CALIBRATION_USER`, one
pipeline whose runs go one after another, at the lowest priority, preemptible, a few
dozen steps each: anything a user
submits goes first, and their history is any job's history once they succeed.

`AutoCalibration` submits them once per node type the service finds uncalibrated, on its
own (`GANGWAY_AUTO_CALIBRATE`: by default only with a Ray cluster of its own, not the
embedded one, whose logical GPUs share this host's cores with users' jobs); `gangway
calibrate` (`POST /v1/calibrations`, admins) submits them on demand, more runs for the
fit. On a cluster of several GPU types the runs name their type (`resources.gpu_types`)
and each type is calibrated in turn, so each type's speed is measured
(`Predictions.gpu_speeds`). A run is still measured on the node shape it lands on, which
for one GPU type on nodes of different sizes may differ from the one it was named for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gangway.models import JobSubmit
from scheduler.model import CALIBRATION_USER, UNFINISHED_STATES, Condition
from scheduler.predict.steptime import NodeType
from scheduler.store import JobRecord, JobRepository
from scheduler.store.records import Step, new_job

log = logging.getLogger("gangway")

NAME_PREFIX = "calibrate "
LOWEST_PRIORITY = -1_000_000


def name_prefix(node: NodeType) -> str:
    """What every calibration run of `node` is named with first."""
    return f"{NAME_PREFIX}{node.name}: "


def calibration_bodies(node: NodeType) -> list[dict[str, object]]:
    """The runs for `node`: (model, steps, batch, parallelism) chosen so the fitted terms
    are each pinned (a small and a larger model: compute; dp=2: gradient bytes; tp=2:
    activation bytes and messages)."""
    two = node.devices_per_node >= 2
    runs: list[tuple[str, int, int, dict[str, int]]] = [
        ("gpt-tiny", 40, 8, {"dp": 1}),
        ("gpt-mini", 20, 4, {"dp": 1}),
        ("gpt-mini", 20, 4, {"dp": 2} if two else {"dp": 1}),
        ("gpt-mini", 20, 4, {"tp": 2} if two else {"dp": 1}),
    ]
    if not two:  # one device: vary the batch instead
        runs[2] = ("gpt-mini", 20, 8, {"dp": 1})
        runs[3] = ("gpt-tiny", 40, 32, {"dp": 1})
    pinned = {"resources": {"gpu_types": [node.gpu_type]}} if node.gpu_type else {}
    return [
        JobSubmit.model_validate(
            {
                "name": f"{name_prefix(node)}{model} b{batch} "
                + " ".join(f"{k}={v}" for k, v in mesh.items()),
                "user": CALIBRATION_USER,
                "priority": LOWEST_PRIORITY,
                **pinned,  # measured on the type it is for, wherever placement prefers
                "parallelism": mesh,
                "time_limit_s": 900,
                "entrypoint": {
                    "kind": "builtin",
                    "model": model,
                    "steps": steps,
                    "batch_size": batch,
                    "eval_every": None,
                },
            }
        ).model_dump(mode="json")
        for model, steps, batch, mesh in runs
    ]


class CalibrationRunning(Exception):
    """Runs of an earlier calibration have not ended: new ones would run beside them."""


def active_calibration(repo: JobRepository) -> list[JobRecord]:
    """Calibration runs that have not ended."""
    return repo.page(
        states=UNFINISHED_STATES, user=CALIBRATION_USER, name_prefix=NAME_PREFIX, limit=10
    )


def submit_calibration(repo: JobRepository, node: NodeType) -> list[JobRecord]:
    """Store the runs for `node` as one pipeline (all or none), each after the one before
    ended: run side by side they would measure each other (ranks sharing a host's
    processors, links, memory bandwidth); their records. `CalibrationRunning` while
    earlier runs have not ended, for the same reason."""
    running = active_calibration(repo)
    if running:
        ids = ", ".join(str(job.id) for job in running)
        raise CalibrationRunning(f"calibration runs {ids} have not ended; they would interfere")
    jobs = [
        new_job(body, depends_on=((Step(index - 1), Condition.ENDED),) if index else ())
        for index, body in enumerate(calibration_bodies(node))
    ]
    return repo.create_pipeline(f"calibrate {node.name}", CALIBRATION_USER, jobs).jobs


class AutoCalibration:
    """Once per node type per process: if the step-time model of a type the nodes have
    is not fitted and no calibration run of that type was ever stored, store them (after
    any other type's runs ended), the most common type first. A query or two per pass
    until then, none after."""

    def __init__(self, repo: JobRepository) -> None:
        self._repo = repo
        self._settled: set[str] = set()

    def check(
        self, node: NodeType | None, calibrated: Callable[[NodeType], bool]
    ) -> Sequence[JobRecord]:
        """The runs stored now for `node` (none if it is measured or was ever queued)."""
        if node is None or node.name in self._settled:
            return []
        done = self._repo.page(user=CALIBRATION_USER, name_prefix=name_prefix(node), limit=1)
        if calibrated(node) or done:
            self._settled.add(node.name)
            return []
        try:
            made = submit_calibration(self._repo, node)
        except CalibrationRunning:  # another type's runs first: asked again next pass
            return []
        self._settled.add(node.name)
        log.info(
            "calibration: %d short runs submitted for node type %s (jobs %s)",
            len(made),
            node.name,
            ", ".join(str(job.id) for job in made),
        )
        return made
