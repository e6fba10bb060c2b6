"""Create the inbox_message table.

Revision ID: 5c1f0e2a9b3d
Revises:
Create Date: 2026-11-25

This revision is frozen: it spells the schema out instead of importing inbox.schema, so a
later change to the metadata needs a new revision (and the schema test will say so).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "5c1f0e2a9b3d"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("inbox",)
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "inbox_message",
        sa.Column(
            "message_id",
            sa.LargeBinary(16).with_variant(mysql.BINARY(16), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column(
            "handler",
            sa.String(255).with_variant(
                mysql.VARCHAR(255, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
            ),
            nullable=False,
        ),
        sa.Column(
            "processed_at",
            sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("message_id", "handler"),
    )
    op.create_index("ix_inbox_message_processed_at", "inbox_message", ["processed_at"])


def downgrade() -> None:
    op.drop_index("ix_inbox_message_processed_at", table_name="inbox_message")
    op.drop_table("inbox_message")
