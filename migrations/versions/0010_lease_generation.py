"""fencing: the lease's generation, and the generation each event was written under

Revision ID: 0010
Revises: 0012
Create Date: 2026-12-01 15:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('leases') as batch:
        batch.add_column(
            sa.Column('generation', sa.Integer(), nullable=False, server_default='0')
        )
    with op.batch_alter_table('job_events') as batch:
        batch.add_column(sa.Column('generation', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_events') as batch:
        batch.drop_column('generation')
    with op.batch_alter_table('leases') as batch:
        batch.drop_column('generation')
