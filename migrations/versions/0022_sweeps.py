"""sweeps: a search over a job's fields, and its trials (each an ordinary job)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 02:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index("ix_sweeps_user", "sweeps", ["user"], unique=False)
    op.create_index("ix_sweeps_state", "sweeps", ["state"], unique=False)
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_trials_sweep_id_sweeps"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_sweep_trials_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("sweep_id", "number", name=op.f("pk_sweep_trials")),
        sa.UniqueConstraint("job_id", name=op.f("uq_sweep_trials_job_id")),
    )


def downgrade() -> None:
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_state", table_name="sweeps")
    op.drop_index("ix_sweeps_user", table_name="sweeps")
    op.drop_table("sweeps")
