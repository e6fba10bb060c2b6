"""Create the inbox_effect table: the ledger of Inbox.effect calls.

Revision ID: 7e3b2a4c9d5f
Revises: 6d2a1f3b8c4e
Create Date: 2026-11-26

Frozen like the first revision: the schema is spelled out here, not imported.
"""

import datetime
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "7e3b2a4c9d5f"
down_revision: str | None = "6d2a1f3b8c4e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _text(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def _long_text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4"), "mysql", "mariadb")


def _timestamp() -> sa.types.TypeEngine[datetime.datetime]:
    return sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _key() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary(16).with_variant(mysql.BINARY(16), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "inbox_effect",
        sa.Column("effect_key", _key(), nullable=False),
        sa.Column("claim_key", _key(), nullable=False),
        sa.Column("handler", _text(255), nullable=False),
        sa.Column("step", _text(255), nullable=False),
        sa.Column("status", _text(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", _long_text(), nullable=True),
        sa.Column("error", _long_text(), nullable=True),
        sa.Column("started_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("effect_key"),
    )
    op.create_index("ix_inbox_effect_claim", "inbox_effect", ["claim_key", "handler"])


def downgrade() -> None:
    op.drop_index("ix_inbox_effect_claim", table_name="inbox_effect")
    op.drop_table("inbox_effect")
