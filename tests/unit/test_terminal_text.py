"""The CLI's one sanitizer for text from the service (`cli_shared.terminal_safe`), on a
table of inputs; its JSON twin; and that the CLI prints through them only."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import gangway
from gangway.cli_shared import echo_json, terminal_safe


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é ü 日本", "plain text, é ü 日本"),
        ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
        ("\x1b[31mred\x1b[0m", "red"),  # CSI: colours
        ("\x1b[2J\x1b[1;1Hcleared", "cleared"),  # CSI: clear screen, move cursor
        ("\x1b[?25lcursor hidden", "cursor hidden"),  # CSI with a private parameter
        ("\x9b31mred", "red"),  # 8-bit CSI
        ("\x1b]0;pwned\x07after", "after"),  # OSC window title, ended by BEL
        ("\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC hyperlink, ended by ST
        ("\x1b]52;c;cGF5bG9hZA==\x07", ""),  # OSC clipboard write
        ("\x9d0;pwned\x9cafter", "after"),  # 8-bit OSC and ST
        ("\x1bP+q544e\x1b\\x", "x"),  # DCS
        ("\x1b_apc\x1b\\x", "x"),  # APC
        ("\x1b7saved\x1b8", "saved"),  # other ESC sequences: save, restore cursor
        ("\x1b(0charset\x1b(B", "charset"),
        ("\x1bcreset", "reset"),  # full reset
        ("\x1b]0;unterminated", "0;unterminated"),  # a broken one: its controls go
        ("\x1b[", ""),
        ("\x1b", ""),
        ("progress 10%\rprogress 100%", "progress 10%progress 100%"),  # no overwriting
        ("bell\x07 nul\x00 bs\x08 del\x7f nel\x85 c1\x9f", "bell nul bs del nel c1"),
    ],
)
def test_terminal_safe_removes_control_sequences_and_keeps_the_text(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


def test_echo_json_escapes_what_json_leaves_raw(capsys: pytest.CaptureFixture[str]) -> None:
    """pydantic's JSON escapes C0 controls but writes DEL and C1 (U+009B: CSI) raw."""
    document = json.dumps({"name": "a\x9b2J\x7f\x85 é"}, ensure_ascii=False)
    echo_json(document)
    printed = capsys.readouterr().out
    assert not any("\x7f" <= char <= "\x9f" for char in printed)
    assert json.loads(printed) == {"name": "a\x9b2J\x7f\x85 é"}  # the same document


def test_the_cli_prints_only_through_cli_shared() -> None:
    """No command calls typer.echo, click.echo or print itself, so none skips the
    sanitizer (cli_shared.echo, echo_json and print_table)."""
    package = Path(gangway.__file__).parent
    direct = []
    for source in sorted(package.glob("*.py")):
        if source.name == "cli_shared.py":
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (isinstance(func, ast.Name) and func.id == "print") or (
                isinstance(func, ast.Attribute)
                and func.attr in ("echo", "secho")
                and isinstance(func.value, ast.Name)
                and func.value.id in ("typer", "click")
            ):
                direct.append(f"{source.name}:{node.lineno}")
    assert direct == []
