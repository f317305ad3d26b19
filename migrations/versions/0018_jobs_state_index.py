"""jobs: the state index also carries id and version, so the loop's narrow
(id, version) query per pass reads the index alone

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 22:55:00
"""

from alembic import op


revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_id_version", "jobs", ["state", "id", "version"], unique=False)
    op.drop_index("ix_jobs_state", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state", "jobs", ["state"], unique=False)
    op.drop_index("ix_jobs_state_id_version", table_name="jobs")
