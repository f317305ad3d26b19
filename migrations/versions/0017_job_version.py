"""jobs.version: bumped by every write to a job row, so the loop reloads only what changed

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 19:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("version")
