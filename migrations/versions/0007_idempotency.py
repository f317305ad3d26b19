"""idempotency keys: a retried submission finds the job the first one made

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 22:45:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('idempotency_key', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('request_digest', sa.String(length=64), nullable=True))
        batch.create_index('ix_jobs_idempotency_key', ['idempotency_key'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_idempotency_key')
        batch.drop_column('request_digest')
        batch.drop_column('idempotency_key')
