"""service history: queued_at, waited_s, attained_gpu_s (least attained service)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 19:50:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('queued_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('waited_s', sa.Float(), nullable=False, server_default='0'))
        batch_op.add_column(
            sa.Column('attained_gpu_s', sa.Float(), nullable=False, server_default='0')
        )


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('attained_gpu_s')
        batch_op.drop_column('waited_s')
        batch_op.drop_column('queued_at')
