"""What every `gangway` command shares: the service address, `--json`, the client (with
the API key from GANGWAY_API_KEY) and turning SDK errors into one line and exit code 1."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.control import strip_control_codes
from rich.table import Table
from rich.text import Text

from gangway.client import Client
from gangway.errors import GangwayError

T = TypeVar("T")

Url = Annotated[str, typer.Option("--url", envvar="GANGWAY_URL", help="service address")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
DEFAULT_URL = "http://127.0.0.1:8000"
_PIPED_WIDTH = 100_000


def connect(url: str) -> Client:
    """A client for `url`; with auth on, GANGWAY_API_KEY holds the caller's key."""
    return Client(url, api_key=os.environ.get("GANGWAY_API_KEY") or None)


def print_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """An aligned table through rich. A column whose name starts with '>' is right-aligned
    (numbers). Cells are plain text: control characters a user put in a job name (terminal
    escape sequences) are stripped and rich markup is not interpreted."""
    table = Table(box=None, pad_edge=False)
    for column in columns:
        right = column.startswith(">")
        table.add_column(column.lstrip(">"), justify="right" if right else "left")
    for row in rows:
        table.add_row(*(Text(strip_control_codes(str(cell))) for cell in row))
    console = Console()
    if not console.is_terminal:  # piped: one row per line, never wrapped at 80 columns
        console = Console(width=_PIPED_WIDTH)
    console.print(table)


def run(call: Callable[[], T]) -> T:
    try:
        return call()
    except GangwayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
