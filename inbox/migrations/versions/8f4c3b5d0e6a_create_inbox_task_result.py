"""Create the inbox_task_result table: the return values of Celery inbox tasks.

Revision ID: 8f4c3b5d0e6a
Revises: 7e3b2a4c9d5f
Create Date: 2026-11-28

Frozen like the first revision: the schema is spelled out here, not imported.
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


def upgrade() -> None:
    op.create_table(
        "inbox_task_result",
        sa.Column("claim_key", _key(), nullable=False),
        sa.Column("task", _text(255), nullable=False),
        sa.Column("result", _long_text(), nullable=False),
        sa.Column("stored_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("claim_key", "task"),
    )
    op.create_index("ix_inbox_task_result_stored_at", "inbox_task_result", ["stored_at"])


def downgrade() -> None:
    op.drop_index("ix_inbox_task_result_stored_at", table_name="inbox_task_result")
    op.drop_table("inbox_task_result")
