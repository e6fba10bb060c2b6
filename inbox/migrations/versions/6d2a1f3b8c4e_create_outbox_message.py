"""Create the outbox_message table (and, on PostgreSQL, its commit notification).

Revision ID: 6d2a1f3b8c4e
Revises: 5c1f0e2a9b3d
Create Date: 2026-11-26

Frozen like the first revision: the schema is spelled out here, not imported.
"""

import datetime
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "6d2a1f3b8c4e"
down_revision: str | None = "5c1f0e2a9b3d"
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


def upgrade() -> None:
    op.create_table(
        "outbox_message",
        sa.Column(
            "id",
            sa.LargeBinary(16).with_variant(mysql.BINARY(16), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("type", _text(255), nullable=False),
        sa.Column("exchange", _text(255), nullable=False),
        sa.Column("routing_key", _text(255), nullable=False),
        sa.Column("content_type", _text(255), nullable=False),
        sa.Column("content_encoding", _text(64), nullable=True),
        sa.Column("headers", _long_text(), nullable=False),
        sa.Column(
            "body",
            sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("available_at", _timestamp(), nullable=False),
        sa.Column("last_error", _long_text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE OR REPLACE FUNCTION inbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN PERFORM pg_notify('inbox_outbox', TG_TABLE_SCHEMA || '.' || "
            "TG_TABLE_NAME); RETURN NULL; END $$"
        )
        op.execute(
            "CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON outbox_message "
            "FOR EACH STATEMENT EXECUTE FUNCTION inbox_outbox_notify()"
        )


def downgrade() -> None:
    op.drop_table("outbox_message")  # its trigger goes with it
    if op.get_bind().dialect.name == "postgresql":
        # Kept while another outbox table (one an application created) still uses it.
        op.execute(
            "DO $$ BEGIN DROP FUNCTION IF EXISTS inbox_outbox_notify(); "
            "EXCEPTION WHEN dependent_objects_still_exist THEN NULL; END $$"
        )
