"""`gangway models`: the model registry. Register a job's checkpoint as the next version
of a model, list and show models (versions, lineage, metrics, aliases), move aliases,
choose readers, download a version's files (checked against their SHA-256)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, run
from gangway.models import ModelExport, ModelInfo, ModelVersionInfo, wire_default

models_app = typer.Typer(help="Model versions from jobs' checkpoints: register, alias, download.")

Readers = Annotated[
    list[str] | None, typer.Option("--reader", help="a user who may read it (repeat)")
]


def parse_source(source: str) -> tuple[int, int | None]:
    """`JOB` or `JOB@STEP` -> (job id, step or None)."""
    job, _, step = source.partition("@")
    try:
        return int(job), (int(step) if step else None)
    except ValueError as exc:
        raise typer.BadParameter(f"{source!r}: JOB or JOB@STEP, as numbers") from exc


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """The models you may read (as `gangway models list`)."""
    if ctx.invoked_subcommand is None:
        list_models(url, as_json)


@models_app.command("list")
def list_models(url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """The models you may read: owner, readers, when made."""
    with cli_shared.connect(url) as client:
        found = run(client.models)
    if as_json:
        echo_json(json.dumps([m.model_dump(mode="json") for m in found], indent=2))
        return
    cli_shared.print_table(
        ["NAME", "OWNER", "READERS", "CREATED"],
        (
            [m.name, m.owner, ", ".join(m.readers) or "-", f"{m.created_at:%Y-%m-%d %H:%M}"]
            for m in found
        ),
    )


@models_app.command("show")
def show(name: str, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """A model's versions: where each came from (job, attempt, step), its size, what it
    measured, its aliases."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.model(name))
    if as_json:
        echo_json(info.model_dump_json(indent=2))
        return
    _print_model(info)


@models_app.command("register")
def register(
    name: str,
    source: Annotated[str, typer.Option("--from", help="JOB or JOB@STEP: its checkpoint")],
    reader: Readers = None,
    url: Url = DEFAULT_URL,
    as_json: AsJson = False,
) -> None:
    """Make the next version of NAME from a job's complete checkpoint (its newest, or the
    one at STEP): files copied and digested, the job's spec and metrics at that step kept."""
    job_id, step = parse_source(source)
    with cli_shared.connect(url) as client:
        made = run(lambda: client.register_model(name, job_id, step=step, readers=reader or ()))
    if as_json:
        echo_json(made.model_dump_json(indent=2))
        return
    echo(
        f"{made.model} v{made.version}: job {made.job_id} attempt {made.attempt} step "
        f"{made.step}, {len(made.files)} files, {made.bytes:,} bytes"
    )


@models_app.command("alias")
def alias(name: str, version: int, alias_name: str, url: Url = DEFAULT_URL) -> None:
    """Point ALIAS_NAME (production, staging, ...) at VERSION of NAME."""
    with cli_shared.connect(url) as client:
        run(lambda: client.set_alias(name, alias_name, version))
    echo(f"{name}: {alias_name} -> v{version}")


@models_app.command("unalias")
def unalias(name: str, alias_name: str, url: Url = DEFAULT_URL) -> None:
    with cli_shared.connect(url) as client:
        run(lambda: client.remove_alias(name, alias_name))
    echo(f"{name}: {alias_name} removed")


@models_app.command("readers")
def readers(name: str, users: list[str], url: Url = DEFAULT_URL) -> None:
    """Set who besides you (and admins) may list, read and download NAME."""
    with cli_shared.connect(url) as client:
        info = run(lambda: client.set_model_readers(name, users))
    echo(f"{info.name}: readers {', '.join(info.readers) or 'none'}")


@models_app.command("download")
def download(
    name: str,
    ref: Annotated[str, typer.Argument(help="a version number or an alias")],
    output: Annotated[Path, typer.Option("-o", "--output", help="the folder to write to")] = Path(
        "."
    ),
    url: Url = DEFAULT_URL,
) -> None:
    """Every file of a version under OUTPUT, each checked against its SHA-256."""
    with cli_shared.connect(url) as client:
        written = run(lambda: client.download_model(name, ref, output))
    total = sum(p.stat().st_size for p in written)
    echo(f"{len(written)} files, {total:,} bytes, verified, under {output}")


@models_app.command("export")
def export(
    name: str,
    ref: Annotated[str, typer.Argument(help="a version number or an alias")],
    *,
    export_format: Annotated[
        str, typer.Option("--format", help="the file format (safetensors)")
    ] = "safetensors",
    quantize: Annotated[str, typer.Option(help="none, or int8: an int8 copy too")] = "none",
    queue: Annotated[str, typer.Option(help="the queue the export job waits in")] = wire_default(
        ModelExport, "queue"
    ),
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="wait, then download the files here")
    ] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Export a version for deployment, as a job on the cluster: one safetensors file
    whatever its dp/tp/pp (and an int8 copy), each with its validation loss."""
    if export_format != "safetensors":
        raise typer.BadParameter(f"--format: safetensors, not {export_format!r}")
    with cli_shared.connect(url) as client:
        job = run(lambda: client.export_model(name, ref, quantize=quantize, queue=queue))
        echo(f"export job {job.id} submitted")
        if output is None:
            return
        run(lambda: client.wait(job.id))
        run(lambda: client.download(job.id, to=output))
    summary = json.loads((output / "export.json").read_text())
    for file, figures in summary["files"].items():
        echo(f"{output / file}: {figures['bytes']:,} bytes, val_loss {figures['val_loss']:.4f}")


@models_app.command("delete")
def delete(name: str, version: int, url: Url = DEFAULT_URL) -> None:
    """Delete VERSION of NAME (its files and aliases); the model goes with its last."""
    with cli_shared.connect(url) as client:
        run(lambda: client.delete_model_version(name, version))
    echo(f"{name} v{version} deleted")


def _print_model(info: ModelInfo) -> None:
    echo(f"{info.name}: owner {info.owner}, readers {', '.join(info.readers) or 'none'}")
    cli_shared.print_table(
        [">VER", "ALIASES", ">JOB", ">ATT", ">STEP", ">BYTES", "METRICS", "CREATED"],
        (_version_row(v) for v in info.versions),
    )


def _version_row(v: ModelVersionInfo) -> list[object]:
    shown = {k: v.metrics[k] for k in ("val_loss", "loss", "val_token_accuracy") if k in v.metrics}
    metrics = " ".join(f"{k}={value:.4g}" for k, value in shown.items()) or "-"
    return [
        v.version,
        ", ".join(v.aliases) or "-",
        v.job_id,
        v.attempt,
        v.step,
        f"{v.bytes:,}",
        metrics,
        f"{v.created_at:%Y-%m-%d %H:%M}",
    ]
