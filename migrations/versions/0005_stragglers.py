"""stragglers: the ranks a running job has flagged as slower than their peers

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 22:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('stragglers', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('stragglers')
