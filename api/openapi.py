"""The REST API's OpenAPI document: `python -m api.openapi [PATH]` writes it (default
`docs/openapi.json`). The committed copy is the contract clients build on; a test fails
when the app's document differs from it, so a change to the API is a change to that
file, seen in review."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from api.app import create_app
from scheduler.store import JobRepository, make_engine

COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def document() -> dict[str, Any]:
    """The app's document; building it touches no database."""
    schema: dict[str, Any] = create_app(JobRepository(make_engine("sqlite://"))).openapi()
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else COMMITTED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(document()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
