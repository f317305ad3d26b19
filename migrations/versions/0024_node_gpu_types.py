"""nodes.gpu_type and nodes.gpu_speed: what GPUs a node has and how fast they train
relative to H100 (measured by calibration, else a seed table)

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 05:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(length=200), nullable=True))
        batch.add_column(
            sa.Column("gpu_speed", sa.Float(), nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("gpu_speed")
        batch.drop_column("gpu_type")
