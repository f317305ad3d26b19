"""queue_members: the users a queue is for (none: every user), who also read the models
shared with the queue

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 21:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_members",
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint("queue", "user", name=op.f("pk_queue_members")),
    )
    op.create_index("ix_queue_members_user", "queue_members", ["user"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_queue_members_user", table_name="queue_members")
    op.drop_table("queue_members")
