"""The folders follow the process boundary: the supervisor (trusted, a Ray actor) imports
no module of the rank program or the engine it runs, and nothing on a node imports the
service. Read from the source with `ast`, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("workers/supervisor", ("workers.program", "workers.engine", "api", "scheduler")),
        ("workers/program", ("workers.supervisor", "api", "scheduler")),
        ("workers/engine", ("workers.supervisor", "api", "scheduler")),
    ],
)
def test_a_folder_imports_nothing_across_its_boundary(
    folder: str, forbidden: tuple[str, ...]
) -> None:
    crossing = {
        path: sorted(m for m in modules if m.split(".")[0] in forbidden or m.startswith(forbidden))
        for path, modules in imported_modules(folder).items()
    }
    assert {path: names for path, names in crossing.items() if names} == {}
