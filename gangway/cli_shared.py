"""What every `gangway` command shares: the service address, `--json`, the client (with
the API key from GANGWAY_API_KEY), turning SDK errors into one line and exit code 1, and
printing: every command prints through `echo`, `echo_json` or `print_table`, so no text
from the service (other users' job names, reasons, errors, log lines) reaches the terminal
with its control sequences."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gangway.client import Client
from gangway.errors import GangwayError

T = TypeVar("T")

Url = Annotated[str, typer.Option("--url", envvar="GANGWAY_URL", help="service address")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
DEFAULT_URL = "http://127.0.0.1:8000"
_PIPED_WIDTH = 100_000

# Terminal control sequences, whole: CSI (ESC [ or the 8-bit CSI, parameters, intermediates,
# a final byte: colours, cursor moves, screen clears); the string controls OSC, DCS, SOS, PM
# and APC up to BEL or ST (window titles, hyperlinks, clipboard writes); any other ESC
# sequence. What is left of a broken one goes with the control characters below.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
)
# C0 controls but tab and newline, DEL and C1 controls. A carriage return is one: it lets a
# line overwrite what was printed before it.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What JSON leaves raw of those (it escapes C0 itself): DEL and C1 (U+009B is a CSI to some
# terminals). Raw, they can only stand inside JSON strings.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f]")


def connect(url: str) -> Client:
    """A client for `url`; with auth on, GANGWAY_API_KEY holds the caller's key."""
    return Client(url, api_key=os.environ.get("GANGWAY_API_KEY") or None)


def terminal_safe(text: str) -> str:
    """`text` without terminal control sequences and control characters; tabs and newlines
    stay. Text from the service may come from anyone: printed as it is, a job name could
    retitle the window, clear the screen, hide or recolour what follows, or overwrite a
    line. (rich's strip_control_codes keeps ESC, so it does not do this.)"""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))


def echo(text: str = "", *, err: bool = False) -> None:
    """Print a line for people, through `terminal_safe` (typer.echo, on stderr with err)."""
    typer.echo(terminal_safe(text), err=err)


def echo_json(document: str) -> None:
    """Print a JSON document for scripts, DEL and C1 controls written as \\u escapes: the
    same document (they stand only inside strings), safe on a terminal too."""
    typer.echo(_RAW_IN_JSON.sub(lambda char: f"\\u{ord(char[0]):04x}", document))


def print_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """An aligned table through rich. A column whose name starts with '>' is right-aligned
    (numbers). Cells are plain text: through `terminal_safe`, and rich markup is not
    interpreted."""
    table = Table(box=None, pad_edge=False)
    for column in columns:
        right = column.startswith(">")
        table.add_column(column.lstrip(">"), justify="right" if right else "left")
    for row in rows:
        table.add_row(*(Text(terminal_safe(str(cell))) for cell in row))
    console = Console()
    if not console.is_terminal:  # piped: one row per line, never wrapped at 80 columns
        console = Console(width=_PIPED_WIDTH)
    console.print(table)


def run(call: Callable[[], T]) -> T:
    try:
        return call()
    except GangwayError as exc:
        echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
