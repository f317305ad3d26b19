"""`gangway outputs` and `gangway download`: what a job's ranks wrote to their OUTPUTS_DIR,
listed and fetched (the job's owner, or an admin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, run

Rank = Annotated[
    int | None,
    typer.Option(min=0, help="one rank's files (default: each path from the lowest rank)"),
]


def outputs(
    job_id: int, rank: Rank = None, url: Url = DEFAULT_URL, as_json: AsJson = False
) -> None:
    """A job's output files, sorted by path, with the rank each copy came from."""
    with cli_shared.connect(url) as client:
        files = run(lambda: client.outputs(job_id, rank=rank))
        summary = run(lambda: client.outputs_page(job_id, limit=1))
    if as_json:
        cli_shared.echo_json(json.dumps([f.model_dump(mode="json") for f in files], indent=2))
        return
    if not files:
        cli_shared.echo(f"job {job_id}: no outputs")
    else:
        cli_shared.print_table(
            ["PATH", ">BYTES", ">RANK", "MODIFIED"],
            ([f.path, f"{f.bytes:,}", f.rank, f"{f.modified_at:%Y-%m-%d %H:%M:%S}"] for f in files),
        )
    line = f"{len(files)} files, {sum(f.bytes for f in files):,} bytes; "
    line += f"the job stores {summary.total_bytes:,} bytes"
    if summary.usage is not None:
        usage = summary.usage
        line += f"; {usage.user} uses {usage.used_bytes:,} of {usage.quota_bytes:,} bytes"
    cli_shared.echo(line)


def download(
    job_id: int,
    path: Annotated[
        str | None, typer.Argument(help="one file (as `gangway outputs` lists it); default: all")
    ] = None,
    to: Annotated[Path, typer.Option(help="write under this folder, keeping relative paths")] = (
        Path(".")
    ),
    rank: Rank = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Download a job's output file, or every one, under --to (never outside it)."""
    with cli_shared.connect(url) as client:
        written = run(lambda: client.download(job_id, path, to, rank=rank))
    total = 0
    for dest in written:
        size = dest.stat().st_size
        total += size
        cli_shared.echo(f"{dest}  {size:,} bytes")
    cli_shared.echo(f"{len(written)} files, {total:,} bytes under {to}")
