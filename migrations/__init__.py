"""Alembic migrations (a package so they ship with the wheel and `serve` can find them)."""
