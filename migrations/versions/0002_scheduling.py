"""scheduling: explanations, estimated start, preemption deadline, user

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 17:18:35.762807
"""

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user', sa.String(length=100), nullable=False, server_default='default'))
        batch_op.add_column(sa.Column('estimated_start_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('explanation', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('preempt_deadline', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_user'), ['user'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_user'))
        batch_op.drop_column('preempt_deadline')
        batch_op.drop_column('explanation')
        batch_op.drop_column('estimated_start_at')
        batch_op.drop_column('user')

