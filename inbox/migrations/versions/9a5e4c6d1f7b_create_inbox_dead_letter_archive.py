"""Create the inbox_dead_letter_archive table: dead letters archived instead of deleted.

Revision ID: 9a5e4c6d1f7b
Revises: 8f4c3b5d0e6a
Create Date: 2026-12-05

Frozen like the first revision: the schema is spelled out here, not imported.
"""

import datetime
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "9a5e4c6d1f7b"
down_revision: str | None = "8f4c3b5d0e6a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE, INDEX = "inbox_dead_letter_archive", "ix_inbox_dead_letter_archive_archived_at"


def _text(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def _long_text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4"), "mysql", "mariadb")


def _timestamp() -> sa.types.TypeEngine[datetime.datetime]:
    return sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column(
            "id",
            sa.LargeBinary(16).with_variant(mysql.BINARY(16), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("queue", _text(255), nullable=False),
        sa.Column("ref", _text(255), nullable=False),
        sa.Column("source", _text(16), nullable=False),
        sa.Column("reason", _text(64), nullable=True),
        sa.Column("error", _long_text(), nullable=True),
        sa.Column("headers", _long_text(), nullable=False),
        sa.Column("properties", _long_text(), nullable=False),
        sa.Column(
            "body",
            sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("dead_lettered_at", _timestamp(), nullable=True),
        sa.Column("archived_at", _timestamp(), nullable=False),
        sa.Column("archived_by", _text(255), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(INDEX, TABLE, ["archived_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name=TABLE)
    op.drop_table(TABLE)
