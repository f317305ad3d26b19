"""jobs.checkpoint_step and jobs.step_time_s: the newest step the running attempt has
saved and rank 0's measured step time, so the scheduler knows what a preemption loses

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 17:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpoint_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("step_time_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("step_time_s")
        batch.drop_column("checkpoint_step")
