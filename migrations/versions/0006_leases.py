"""leases: one scheduler loop per database (leader lease)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 22:20:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'leases',
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('holder', sa.String(length=200), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_leases')),
    )


def downgrade() -> None:
    op.drop_table('leases')
