"""job dependencies and pipelines: a job waits for other jobs until a condition on each
holds; jobs submitted together as the named steps of a pipeline; a hold that keeps a
pending job from starting

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 01:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pipelines")),
    )
    op.create_index("ix_pipelines_user", "pipelines", ["user"], unique=False)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pipeline_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("hold", sa.Text(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_jobs_pipeline_id_pipelines"),
            "pipelines",
            ["pipeline_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_jobs_pipeline_id", ["pipeline_id"], unique=False)
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("upstream_id", sa.Integer(), nullable=False),
        sa.Column("condition", sa.String(length=16), nullable=False),
        sa.Column("waiting", sa.Boolean(), nullable=False),
        sa.Column("met_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_dependencies_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["upstream_id"],
            ["jobs.id"],
            name=op.f("fk_job_dependencies_upstream_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "upstream_id", name=op.f("pk_job_dependencies")),
    )
    op.create_index(
        "ix_job_dependencies_upstream_id", "job_dependencies", ["upstream_id"], unique=False
    )
    op.create_index(
        "ix_job_dependencies_waiting",
        "job_dependencies",
        ["job_id"],
        unique=False,
        sqlite_where=sa.text("waiting"),
        postgresql_where=sa.text("waiting"),
    )


def downgrade() -> None:
    op.drop_index("ix_job_dependencies_waiting", table_name="job_dependencies")
    op.drop_index("ix_job_dependencies_upstream_id", table_name="job_dependencies")
    op.drop_table("job_dependencies")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_pipeline_id")
        batch.drop_constraint(op.f("fk_jobs_pipeline_id_pipelines"), type_="foreignkey")
        batch.drop_column("pipeline_id")
        batch.drop_column("hold")
    op.drop_index("ix_pipelines_user", table_name="pipelines")
    op.drop_table("pipelines")
