"""What every `gangway` command shares: the service address, `--json`, the client (with
the API key from GANGWAY_API_KEY) and turning SDK errors into one line and exit code 1."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from gangway.client import Client
from gangway.errors import GangwayError

T = TypeVar("T")

Url = Annotated[str, typer.Option("--url", envvar="GANGWAY_URL", help="service address")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
DEFAULT_URL = "http://127.0.0.1:8000"


def connect(url: str) -> Client:
    """A client for `url`; with auth on, GANGWAY_API_KEY holds the caller's key."""
    return Client(url, api_key=os.environ.get("GANGWAY_API_KEY") or None)


def run(call: Callable[[], T]) -> T:
    try:
        return call()
    except GangwayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def printable(text: str) -> str:
    """`text` without control and format characters: a name someone else chose must not
    move the cursor, recolour or retitle the terminal (ESC sequences) or reorder the line
    (bidi overrides)."""
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf"))
