"""nodes keep their rack (gangs are placed inside one rack; the API showed none)

Revision ID: 0015
Revises: 0009
Create Date: 2026-12-01 16:10:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes') as batch:
        batch.add_column(sa.Column('rack', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('nodes') as batch:
        batch.drop_column('rack')
