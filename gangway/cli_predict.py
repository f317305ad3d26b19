"""`gangway estimate` (what a job would get if submitted now) and `gangway accuracy`
(how good the service's run-time predictions have been)."""

from __future__ import annotations

from datetime import datetime

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, run
from gangway.cli_spec import SpecFlags, job_spec, with_spec_flags
from gangway.models import RuntimePrediction


@with_spec_flags
def estimate(flags: SpecFlags, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Ask before you submit: predicted step time, run time and earliest start of a job
    (the same flags and files as submit); with --auto, the plan that finishes soonest."""
    spec = job_spec(flags)
    with cli_shared.connect(url) as client:
        answer = run(lambda: client.estimate(spec))
    if as_json:
        echo_json(answer.model_dump_json(indent=2))
        return
    mesh = answer.parallelism
    fsdp = " fsdp" if mesh.fsdp else ""
    echo(f"plan: dp={mesh.dp} tp={mesh.tp} pp={mesh.pp}{fsdp}")
    if answer.plan_reason:
        echo(f"  chosen: {answer.plan_reason}")
    if answer.step_time_s is not None:
        echo(f"step time: {answer.step_time_s:.3f} s")
    echo(f"run time: {describe(answer.prediction)}")
    echo(f"earliest start: {when(answer.estimated_start_at)}")
    if answer.wait_reason:
        echo(f"  waits because: {answer.wait_reason}")
    echo(f"expected end: {when(answer.estimated_end_at)}")


def accuracy(url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """How far run-time predictions were from the actual run times of finished jobs."""
    with cli_shared.connect(url) as client:
        found = run(client.prediction_accuracy)
    if as_json:
        echo_json(found.model_dump_json(indent=2))
        return
    if found.median_ape is None:
        echo(f"no predicted job has finished yet ({found.unknown} unknown)")
        return
    rho = f"{found.spearman:.2f}" if found.spearman is not None else "-"
    echo(
        f"median absolute error {found.median_ape:.1%} over {found.predicted} finished jobs "
        f"(rank correlation {rho}; {found.unknown} were unknown)"
    )


def describe(prediction: RuntimePrediction | None) -> str:
    """`1.5 h (history: median of 4 finished jobs of the same user, name)`."""
    if prediction is None:
        return "not predicted yet"
    if prediction.runtime_s is None:
        return f"unknown ({prediction.basis})"
    span = ""
    if prediction.low_s is not None and prediction.high_s is not None:
        span = f", {duration(prediction.low_s)}-{duration(prediction.high_s)}"
    return f"{duration(prediction.runtime_s)}{span} ({prediction.source}: {prediction.basis})"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if at is not None else "unknown"
