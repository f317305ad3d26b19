"""Alembic environment: online migrations against the URL the service is configured with."""

from __future__ import annotations

from alembic import context

from scheduler.store.db import make_engine
from scheduler.store.tables import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
if not url:
    raise RuntimeError("set sqlalchemy.url (GANGWAY_DATABASE_URL) before migrating")

engine = make_engine(url)
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
