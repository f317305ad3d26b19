"""model registry: registered models (owner, readers), their immutable versions (lineage,
spec, metrics, file digests) and aliases

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 23:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def _model_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["model_id"],
        ["registered_models.id"],
        name=op.f(f"fk_{table}_model_id_registered_models"),
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "registered_models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("readers", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_version", sa.Integer(), server_default="1", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registered_models")),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _model_fk("model_versions"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("model_id", "version"),
    )
    op.create_index(
        op.f("ix_model_versions_job_id"), "model_versions", ["job_id"], unique=False
    )
    op.create_table(
        "model_aliases",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        _model_fk("model_aliases"),
        sa.PrimaryKeyConstraint("model_id", "alias", name=op.f("pk_model_aliases")),
    )


def downgrade() -> None:
    op.drop_table("model_aliases")
    op.drop_index(op.f("ix_model_versions_job_id"), table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_table("registered_models")
