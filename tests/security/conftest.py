"""The CLI fixture the integration tests use (the app in process, no server), shared here."""

from tests.integration.test_cli import cli as cli
