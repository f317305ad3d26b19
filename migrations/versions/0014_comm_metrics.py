"""job metrics: time in data-parallel collectives and their bytes per step

Revision ID: 0014
Revises: 0011
Create Date: 2026-12-01 16:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_metrics') as batch:
        batch.add_column(sa.Column('comm_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('comm_bytes', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_metrics') as batch:
        batch.drop_column('comm_bytes')
        batch.drop_column('comm_s')
