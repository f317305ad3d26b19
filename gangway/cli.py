"""The `gangway` command line: serve the service, submit and follow jobs."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gangway import cli_shared
from gangway.cli_admin import calibrate, queues_app, users_app, whoami
from gangway.cli_metrics import metrics
from gangway.cli_models import models_app
from gangway.cli_outputs import download, outputs
from gangway.cli_pipelines import is_pipeline, pipeline_app, pipeline_from, submit_pipeline
from gangway.cli_predict import accuracy, describe, estimate, when
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, run, terminal_safe
from gangway.cli_spec import SpecFlags, job_spec, read_body, with_spec_flags
from gangway.cli_sweeps import sweep_app
from gangway.client import Client
from gangway.errors import validation_failed
from gangway.models import (
    JobInfo,
    JobState,
    JobSubmit,
    LogLine,
    submit_body,
)
from gangway.requirement_lines import first_refused

_V = TypeVar("_V")
_COMMENT = re.compile(r"(^|\s)#.*$")

app = typer.Typer(
    help="Gangway: schedule and run distributed PyTorch training.", no_args_is_help=True
)
app.add_typer(queues_app, name="queues")
app.add_typer(users_app, name="users")
app.add_typer(models_app, name="models")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(sweep_app, name="sweep")
app.command()(whoami)
app.command()(calibrate)
app.command()(estimate)
app.command()(accuracy)
app.command()(outputs)
app.command()(metrics)
app.command()(download)


def _needs_server_extra(command: str, exc: ModuleNotFoundError) -> typer.Exit:
    """The client install (`pip install gangway`) has no service: say what to install."""
    echo(
        f"gangway {command} needs the server install (missing module {exc.name!r}): "
        "pip install 'gangway[server]'",
        err=True,
    )
    return typer.Exit(code=1)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="bind port")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="join this Ray; default starts one")
    ] = None,
) -> None:
    """Run the service: API, status page and scheduler (settings from GANGWAY_* variables)."""
    try:
        from api.server import serve as run_server
        from api.settings import Settings
    except ModuleNotFoundError as exc:
        raise _needs_server_extra("serve", exc) from exc

    overrides: dict[str, Any] = {"host": host, "port": port, "ray_address": ray_address}
    run_server(Settings(**{k: v for k, v in overrides.items() if v is not None}))


@app.command()
@with_spec_flags
def submit(
    flags: SpecFlags,
    wait: Annotated[bool, typer.Option(help="wait until the job ends")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="retry-safe: the same key returns the same job")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="ship this directory (minus .gitignore/.gangwayignore); ranks run in it",
        ),
    ] = None,
    requirements: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="pip requirements file for the ranks"),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="K=V for the ranks' environment; repeatable")
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME: a variable for the ranks whose value is read from this environment's "
            "NAME (NAME=VALUE: taken as given) and never shown back; repeatable",
        ),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            help="JOB[:CONDITION]: wait for job JOB until it succeeded (the default), ended, "
            "failed or started; repeatable",
        ),
    ] = None,
    pip_options: Annotated[
        bool,
        typer.Option(
            "--pip-options",
            help="send requirement lines with pip options, URLs or paths (only a service "
            "whose admin allows them takes them)",
        ),
    ] = False,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="after --: the command every rank runs (torchrun-style)"),
    ] = None,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """Submit a job: from flags, or from a job file (the REST body, as YAML or JSON;
    --name then overrides its name), or several as a pipeline (a file with `name` and
    `jobs`). `gangway submit --workdir . -- python train.py` ships the directory and runs
    the command on every rank."""
    if flags.file is not None and is_pipeline(body := read_body(flags.file)):
        if after or workdir or command:
            echo("error: a pipeline file says each step's fields itself", err=True)
            raise typer.Exit(2)
        submit_pipeline(pipeline_from(body, flags.file), url, as_json)
        return
    spec = job_spec(flags, command=command, workdir=workdir)
    fields = _code_fields(spec, requirements, env or []) | _secret_fields(spec, secret or [])
    if after:
        fields["depends_on"] = [*submit_body(spec)["depends_on"], *map(_dependency, after)]
    spec = _with_fields(spec, fields)
    if not pip_options:
        _check_requirements(spec.requirements)
    with cli_shared.connect(url) as client:
        if workdir is not None:
            shipped = run(lambda: client.ship(workdir))
            sent = (
                f"{shipped.bytes_sent} bytes uploaded" if shipped.bytes_sent else "nothing uploaded"
            )
            echo(f"working directory {shipped.sha256[:12]}: {sent}", err=True)
            spec = spec.model_copy(update={"package": shipped.sha256})
        job: JobInfo = run(lambda: client.submit(spec, idempotency_key=idempotency_key))
        if wait:
            job = _wait(client, job, show_progress=not as_json)
    _print_job(job, as_json)


def _dependency(flag: str) -> dict[str, Any]:
    """`12` or `12:ended` as a `depends_on` entry (the server checks the condition)."""
    job, _, condition = flag.partition(":")
    if not job.isdigit():
        echo(f"error: --after {flag!r}: give JOB[:CONDITION], e.g. 12 or 12:ended", err=True)
        raise typer.Exit(2)
    return {"job": int(job), "on": condition or "succeeded"}


def _with_fields(spec: JobSubmit, fields: dict[str, Any]) -> JobSubmit:
    """The spec with `fields` replaced, validated again (a bad --env name is an error)."""
    if not fields:
        return spec
    try:
        body = submit_body(spec, mode="python")
        if "user" not in spec.model_fields_set:
            del body["user"]  # the server fills in the caller
        return JobSubmit.model_validate({**body, **fields})
    except ValidationError as exc:
        echo(f"error: {validation_failed(exc)}", err=True)
        raise typer.Exit(2) from exc


def _code_fields(spec: JobSubmit, requirements: Path | None, env: list[str]) -> dict[str, Any]:
    """--requirements and --env on top of what a job file says."""
    fields: dict[str, Any] = {}
    if requirements is not None:
        # As pip reads the file: a '#' at the start or after whitespace begins a comment.
        lines = [_COMMENT.sub("", line).strip() for line in requirements.read_text().splitlines()]
        fields["requirements"] = [line for line in lines if line]
    if env:
        pairs = [item.partition("=") for item in env]
        bad = [item for item, (_, sep, _) in zip(env, pairs, strict=True) if not sep]
        if bad:
            echo(f"error: --env takes K=V, not {bad[0]!r}", err=True)
            raise typer.Exit(2)
        fields["env"] = {**spec.env, **{k: v for k, _, v in pairs}}
    return fields


def _secret_fields(spec: JobSubmit, secrets: list[str]) -> dict[str, Any]:
    """--secret NAME takes NAME's value from this process's environment (so it appears in
    no shell history or process list), --secret NAME=VALUE the value given."""
    if not secrets:
        return {}
    found = dict(spec.secrets)
    for item in secrets:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                echo(f"error: --secret {name}: no {name} in this environment", err=True)
                raise typer.Exit(2)
            value = os.environ[name]
        found[name] = value
    return {"secrets": found}


def _check_requirements(lines: list[str]) -> None:
    """The service refuses requirement lines that are not plain requirements unless its
    admin allows them: say so before a working directory is uploaded for nothing."""
    refused = first_refused(lines)
    if refused is not None:
        index, why = refused
        echo(
            f"error: requirements.{index} {lines[index]!r}: {why} (--pip-options sends it "
            "anyway, for a service whose admin allows pip options)",
            err=True,
        )
        raise typer.Exit(2)


def _wait(client: Client, job: JobInfo, *, show_progress: bool) -> JobInfo:
    """Until the job ends, with a bar on stderr fed by its step count."""
    if not show_progress:
        ended: JobInfo = run(lambda: client.wait(job.id, timeout_s=24 * 3600))
        return ended
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[step]}"))
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(f"job {job.id}", total=job.progress.total_steps, step="")

        def show(seen: JobInfo) -> None:
            bar.update(
                task,
                completed=seen.progress.step,
                description=f"job {seen.id} {seen.state}",
                step=terminal_safe(progress_text(seen)),
            )

        done: JobInfo = run(lambda: client.wait(job.id, timeout_s=24 * 3600, on_poll=show))
    return done


@app.command()
def cluster(url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Nodes, their GPUs (total, allocated, free), health and the jobs on each."""
    with cli_shared.connect(url) as client:
        info = run(client.cluster)
    if as_json:
        echo_json(info.model_dump_json(indent=2))
        return
    cli_shared.print_table(
        ["NODE", "HEALTH", "TYPE", ">SPEED", ">GPUS", ">USED", ">FREE", "JOBS"],
        (
            [
                node.name,
                "alive" if node.alive else "down",
                node.gpu_type or "-",
                f"{node.gpu_speed:g}",
                node.gpus_total,
                node.gpus_allocated,
                node.gpus_free,
                ", ".join(str(j) for j in node.jobs) or "-",
            ]
            for node in info.nodes
        ),
    )
    echo(f"total: {info.gpus_total} GPUs, {info.gpus_allocated} allocated, {info.gpus_free} free")


@app.command()
def jobs(
    state: Annotated[
        list[JobState] | None, typer.Option(help="filter by state (repeat for several)")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="only this queue")] = None,
    user: Annotated[str | None, typer.Option(help="only this user's")] = None,
    name_prefix: Annotated[str | None, typer.Option(help="names starting with this")] = None,
    limit: int = 50,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    with cli_shared.connect(url) as client:
        page = run(
            lambda: client.list(
                state=state, queue=queue, user=user, name_prefix=name_prefix, limit=limit
            )
        )
    if as_json:
        echo_json(page.model_dump_json(indent=2))
        return
    rows = []
    for job in page.items:
        step = progress_text(job).removeprefix("step ")
        ends = when(job.estimated_end_at) if job.estimated_end_at else "-"
        rows.append([job.id, job.state.value, job.num_gpus, job.priority, step, ends, job.name])
    cli_shared.print_table([">ID", "STATE", ">GPUS", ">PRI", ">STEP", "EXPECTED END", "NAME"], rows)


@app.command()
def status(job_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Show one job: state, reason, placement and progress."""
    with cli_shared.connect(url) as client:
        job = run(lambda: client.get(job_id))
    _print_job(job, as_json)


@app.command()
def cancel(job_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Cancel a job."""
    with cli_shared.connect(url) as client:
        job = run(lambda: client.cancel(job_id))
    _print_job(job, as_json)


@app.command()
def priority(job_id: int, value: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Change a job's priority (higher runs first)."""
    with cli_shared.connect(url) as client:
        job = run(lambda: client.set_priority(job_id, value))
    _print_job(job, as_json)


@app.command()
def explain(job_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Why a job is where it is; for a pending job, what blocks it and when it should start."""
    with cli_shared.connect(url) as client:
        why = run(lambda: client.explain(job_id))
    if as_json:
        echo_json(why.model_dump_json(indent=2))
        return
    echo(f"job {why.job_id}: {why.state.value} in queue {why.queue!r}, priority {why.priority}")
    echo(f"  {why.reason}")
    if why.state is JobState.PENDING:
        position = why.queue_position if why.queue_position is not None else "?"
        echo(f"  queue position {position}; estimated start {_when(why.estimated_start_at)}")
        if why.blocker:
            echo(f"  blocked by: {why.blocker}: {why.message}")
            echo(f"  unblocks when: {why.unblock}")
        if why.queued_s is not None:
            echo(f"  queued for {why.queued_s / 60:.1f} min")
    for title, links in (("waits for", why.upstream), ("waited for by", why.downstream)):
        for link in links:
            status = "waiting" if link.waiting else "met" if link.met_at else "not met"
            job = f"job {link.job} {link.name!r} ({link.state.value})"
            echo(f"  {title}: {job} on {link.on}: {status}")
    echo(f"  GPU time so far: {why.attained_gpu_hours:.2f} GPU-hours")


@app.command("queue")
def queue_(
    queue: Annotated[str | None, typer.Option("--queue", help="only this queue")] = None,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """Pending jobs in the scheduler's order, with estimated starts and reasons."""
    with cli_shared.connect(url) as client:
        page = run(lambda: client.list(state=JobState.PENDING, queue=queue, limit=500))
    pending = sorted(
        page.items,
        key=lambda j: (j.explanation.queue_position if j.explanation else None) or 10**9,
    )
    if as_json:
        echo_json(json.dumps([j.model_dump(mode="json") for j in pending], indent=2))
        return
    cli_shared.print_table(
        [">POS", ">ID", ">PRI", ">GPUS", "ESTIMATED START", "REASON"],
        (
            [
                (job.explanation.queue_position if job.explanation else None) or "-",
                job.id,
                job.priority,
                job.num_gpus,
                _when(job.estimated_start_at),
                job.status_reason,
            ]
            for job in pending
        ),
    )


def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M} UTC" if at is not None else "unknown"


@app.command()
def events(job_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """A job's timeline: every state change and note, with its reason, oldest first."""
    with cli_shared.connect(url) as client:
        timeline = run(lambda: client.events(job_id))
    if as_json:
        echo_json(json.dumps([e.model_dump(mode="json") for e in timeline], indent=2))
        return
    for event in timeline:
        before = f"{event.from_state.value} -> " if event.from_state else ""
        echo(f"{event.at:%Y-%m-%d %H:%M:%S}  {before}{event.to_state.value}: {event.reason}")


@app.command()
def checkpoints(job_id: int, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """A job's complete checkpoints, oldest first (it resumes from the last)."""
    with cli_shared.connect(url) as client:
        saved = run(lambda: client.checkpoints(job_id))
    if as_json:
        echo_json(saved.model_dump_json(indent=2))
        return
    if not saved.checkpoints:
        echo(f"job {job_id}: no checkpoints")
        return
    echo(f"in {saved.directory}")
    cli_shared.print_table(
        [">STEP", ">BYTES", "SAVED AT"],
        ([c.step, f"{c.bytes:,}", f"{c.saved_at:%Y-%m-%d %H:%M:%S}"] for c in saved.checkpoints),
    )


@app.command()
def logs(
    job_id: int,
    rank: Annotated[int | None, typer.Option(min=0, help="one rank only")] = None,
    tail: Annotated[int, typer.Option(min=1, max=10_000, help="the last N lines")] = 200,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new lines until the job ends")
    ] = False,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """What a job's ranks printed (all attempts), oldest first."""
    with cli_shared.connect(url) as client:
        if follow:
            run(lambda: _print_lines(client.follow_logs(job_id, rank=rank, tail=tail), as_json))
            return
        lines = run(lambda: client.logs(job_id, rank=rank, tail=tail))
    if as_json:
        echo_json(json.dumps([line.model_dump() for line in lines]))
        return
    _print_lines(lines, as_json=False)


def _print_lines(lines: Iterable[LogLine], as_json: bool) -> None:
    """One line each (JSON lines with --json), printed as they come."""
    for line in lines:
        if as_json:
            echo_json(line.model_dump_json())
        else:
            echo(f"[attempt {line.attempt} rank {line.rank}] {line.line}")


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="trace CSV")],
    nodes: Annotated[
        int | None, typer.Option(min=1, help="nodes in the cluster (or give --node-types)")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(min=1)] = 8,
    nodes_per_rack: Annotated[int | None, typer.Option(min=1)] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="policy to run (repeat); default: all")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N jobs")] = None,
    tick_s: Annotated[float, typer.Option(help="at most one scheduling pass per tick")] = 60.0,
    wait_tick_s: Annotated[
        float, typer.Option(help="a pass this often while jobs wait and nothing happens")
    ] = 300.0,
    checkpoint_interval_s: float = 1800.0,
    checkpoint_save_s: float = 60.0,
    restore_s: float = 60.0,
    time_limit_factor: Annotated[
        float | None, typer.Option(help="jobs declare limits of duration x F (user estimates)")
    ] = None,
    oracle: Annotated[bool, typer.Option(help="let the policy see true durations")] = False,
    placement: Annotated[
        str, typer.Option(help="consolidated (gangs by node) or count (any free GPUs)")
    ] = "consolidated",
    out: Annotated[Path, typer.Option(help="folder for result.json and plots")] = Path(
        "sim-results"
    ),
    node_types: Annotated[
        str | None,
        typer.Option(help="GPU types in node order, e.g. H100=6,A100=6 (nodes: their sum)"),
    ] = None,
    gpu_speeds: Annotated[
        str | None,
        typer.Option(help="relative speed per type, e.g. H100=2,A100=1 (else a seed table)"),
    ] = None,
    type_blind: Annotated[
        bool, typer.Option(help="also run each policy placing jobs as if types were one")
    ] = False,
) -> None:
    """Replay a cluster trace through Gangway's scheduling core and the baselines."""
    try:
        from scheduler.sim.run import simulate_command
    except ModuleNotFoundError as exc:
        raise _needs_server_extra("simulate", exc) from exc

    types = _pairs("--node-types", node_types, int)
    nodes = nodes or sum(count for _, count in types)
    if not nodes:
        raise typer.BadParameter("give --nodes or --node-types", param_hint="--nodes")
    simulate_command(
        trace=trace,
        policies=policy or [],
        limit=limit,
        out=out,
        cluster={
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "nodes_per_rack": nodes_per_rack,
            "tick_s": tick_s,
            "wait_tick_s": wait_tick_s,
            "checkpoint_interval_s": checkpoint_interval_s,
            "checkpoint_save_s": checkpoint_save_s,
            "restore_s": restore_s,
            "time_limit_factor": time_limit_factor,
            "oracle": oracle,
            "placement": placement,
            "node_types": types,
            "gpu_speeds": _pairs("--gpu-speeds", gpu_speeds, float),
        },
        blind_too=type_blind,
    )


def _pairs(option: str, text: str | None, value: Callable[[str], _V]) -> tuple[tuple[str, _V], ...]:
    """NAME=NUMBER,NAME=NUMBER -> ((NAME, NUMBER), ...), naming the option when malformed."""
    pairs = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, raw = item.partition("=")
        try:
            if not name.strip():
                raise ValueError(name)
            pairs.append((name.strip(), value(raw)))
        except ValueError:
            bad = f"expected NAME=NUMBER, got {item!r}"
            raise typer.BadParameter(bad, param_hint=option) from None
    return tuple(pairs)


def _print_job(job: JobInfo, as_json: bool) -> None:
    if as_json:
        echo_json(job.model_dump_json(indent=2))
        return
    echo(f"job {job.id} {job.name!r}: {job.state.value}  ({job.status_reason})")
    progress = job.progress
    loss = f"{progress.loss:.4f}" if progress.loss is not None else "-"
    echo(f"  {progress_text(job)}  loss {loss}")
    echo(f"  predicted run time: {describe(job.prediction)}")
    if job.estimated_end_at is not None:
        echo(f"  expected end: {when(job.estimated_end_at)}")
    if job.placement:
        ranks = ", ".join(f"{p.rank}->{p.node_name}" for p in job.placement)
        echo(f"  placement: {ranks}")
    if job.secret_names:
        echo(f"  secrets: {', '.join(job.secret_names)} (values never shown)")
    if job.error:
        lines = job.error.strip().splitlines()
        echo("  error: " + "\n    ".join([lines[0], *lines[1:][-ERROR_LINES:]]))


ERROR_LINES = 12  # of a failed job's error, after its first line (which rank, how it ended)


def progress_text(job: JobInfo) -> str:
    """Where a job is: its step (of its total, when it has one); a script or command that
    reports no steps is just running."""
    progress = job.progress
    if progress.total_steps:
        return f"step {progress.step}/{progress.total_steps}"
    if progress.step:
        return f"step {progress.step}"
    return "running" if job.state is JobState.RUNNING else "-"
