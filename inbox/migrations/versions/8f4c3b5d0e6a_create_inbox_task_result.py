"""Create the inbox_task_result table: the return values of Celery inbox tasks.

Revision ID: 8f4c3b5d0e6a
Revises: 7e3b2a4c9d5f
Create Date: 2026-11-28

Frozen like the first revision: the schema is spelled out here, not imported.

Before this revision, docs/celery.md said to create the table with
``result_metadata.create_all(engine)`` (no ``stored_at`` index then): such a table is
adopted as it is, and only its missing index is created.
"""

import datetime
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "8f4c3b5d0e6a"
down_revision: str | None = "7e3b2a4c9d5f"
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


TABLE, INDEX = "inbox_task_result", "ix_inbox_task_result_stored_at"


def _exists() -> tuple[bool, bool]:
    """Whether the table, and its ``stored_at`` index, are already there (``--sql``
    output cannot look: it creates both)."""
    if op.get_context().as_sql:
        return False, False
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table(TABLE):
        return False, False
    return True, INDEX in {index["name"] for index in inspector.get_indexes(TABLE)}


def upgrade() -> None:
    table_there, index_there = _exists()
    if index_there:
        return
    if not table_there:
        _create_table()
    op.create_index(INDEX, TABLE, ["stored_at"])


def _create_table() -> None:
    op.create_table(
        TABLE,
        sa.Column("claim_key", _key(), nullable=False),
        sa.Column("task", _text(255), nullable=False),
        sa.Column("result", _long_text(), nullable=False),
        sa.Column("stored_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("claim_key", "task"),
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name=TABLE)
    op.drop_table(TABLE)
