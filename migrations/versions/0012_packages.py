"""uploaded working directories (packages); Idempotency-Keys unique per user

Revision ID: 0012
Revises: 0015
Create Date: 2026-12-01 16:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'packages',
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('size_bytes', sa.Integer(), nullable=False),
        sa.Column('owner', sa.String(length=100), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('sha256', name=op.f('pk_packages')),
    )
    op.create_index(
        op.f('ix_packages_last_used_at'), 'packages', ['last_used_at'], unique=False
    )
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_idempotency_key')
        batch.create_index(
            'ix_jobs_user_idempotency_key', ['user', 'idempotency_key'], unique=True
        )


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_index('ix_jobs_user_idempotency_key')
        batch.create_index('ix_jobs_idempotency_key', ['idempotency_key'], unique=True)
    op.drop_index(op.f('ix_packages_last_used_at'), table_name='packages')
    op.drop_table('packages')
