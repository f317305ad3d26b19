"""job_predictions: each job's predicted run time, its source and estimated end

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-01 16:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0016"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_predictions",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("runtime_s", sa.Float(), nullable=True),
        sa.Column("remaining_s", sa.Float(), nullable=True),
        sa.Column("low_s", sa.Float(), nullable=True),
        sa.Column("high_s", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=20), nullable=False),
        sa.Column("basis", sa.Text(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("estimated_end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("at_start_s", sa.Float(), nullable=True),
        sa.Column("node_type", sa.String(length=100), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_predictions_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_predictions")),
    )


def downgrade() -> None:
    op.drop_table("job_predictions")
