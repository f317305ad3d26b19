"""reported metrics: every point a job reports (values by name), the names it has
reported, and its best objective value

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04 22:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _job_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "job_metric_points",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        _job_fk("job_metric_points"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_metric_points")),
    )
    op.create_index(
        "ix_job_metric_points_job_id_id", "job_metric_points", ["job_id", "id"], unique=False
    )
    op.create_index(
        "ix_job_metric_points_job_id_attempt_seq",
        "job_metric_points",
        ["job_id", "attempt", "seq"],
        unique=False,
    )
    op.create_table(
        "job_metric_names",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        _job_fk("job_metric_names"),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_job_metric_names")),
    )
    op.create_table(
        "job_objectives",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=100), nullable=False),
        sa.Column("mode", sa.String(length=3), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        _job_fk("job_objectives"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_objectives")),
    )


def downgrade() -> None:
    op.drop_table("job_objectives")
    op.drop_table("job_metric_names")
    op.drop_index("ix_job_metric_points_job_id_attempt_seq", table_name="job_metric_points")
    op.drop_index("ix_job_metric_points_job_id_id", table_name="job_metric_points")
    op.drop_table("job_metric_points")
