"""telemetry indexes: job logs by (job_id, id) and (job_id, attempt, rank, seq); metrics by at

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:00:00
"""

from alembic import op


revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_logs_job_id_id", "job_logs", ["job_id", "id"], unique=False)
    op.create_index(
        "ix_job_logs_job_id_attempt_rank_seq",
        "job_logs",
        ["job_id", "attempt", "rank", "seq"],
        unique=False,
    )
    # (job_id, id) leads with job_id: the single-column index is redundant.
    op.drop_index("ix_job_logs_job_id", table_name="job_logs")
    op.create_index(op.f("ix_job_metrics_at"), "job_metrics", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_metrics_at"), table_name="job_metrics")
    op.create_index("ix_job_logs_job_id", "job_logs", ["job_id"], unique=False)
    op.drop_index("ix_job_logs_job_id_attempt_rank_seq", table_name="job_logs")
    op.drop_index("ix_job_logs_job_id_id", table_name="job_logs")
