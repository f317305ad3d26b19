"""job metrics: a point per observed step (loss, tokens/s, step time, memory)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 23:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'job_metrics',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('loss', sa.Float(), nullable=True),
        sa.Column('tokens_per_s', sa.Float(), nullable=True),
        sa.Column('step_time_s', sa.Float(), nullable=True),
        sa.Column('memory_mb', sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ['job_id'], ['jobs.id'], name=op.f('fk_job_metrics_job_id_jobs'), ondelete='CASCADE'
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_metrics')),
    )
    op.create_index(op.f('ix_job_metrics_job_id'), 'job_metrics', ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_job_metrics_job_id'), table_name='job_metrics')
    op.drop_table('job_metrics')
