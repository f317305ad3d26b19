"""`python -m gangway` is the `gangway` command."""

from gangway.cli import app

app()
