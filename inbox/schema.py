"""The inbox's tables (claims, outbox, effects, Celery task results, the dead-letter
archive), defined once in SQLAlchemy metadata; the alembic revisions create exactly them."""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Final

from sqlalchemy import (
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    event,
)

from inbox._backends import with_family_types
from inbox._column_types import BinaryUUID, UTCDateTime
from inbox._outbox_notify import NOTIFY_DDL
from inbox.errors import ConfigurationError

# The public names. The default names, column types, limits and resolvers below are the
# package's own (the constructors' defaults say the names); they are not in __all__.
__all__ = [
    "archive_table",
    "effect_table",
    "inbox_dead_letter_archive",
    "inbox_effect",
    "inbox_message",
    "inbox_table",
    "inbox_task_result",
    "metadata",
    "outbox_message",
    "outbox_table",
    "processed_at_index_name",
    "result_table",
]

DEFAULT_TABLE_NAME: Final = "inbox_message"
DEFAULT_OUTBOX_TABLE_NAME: Final = "outbox_message"
DEFAULT_EFFECT_TABLE_NAME: Final = "inbox_effect"
DEFAULT_RESULT_TABLE_NAME: Final = "inbox_task_result"
DEFAULT_ARCHIVE_TABLE_NAME: Final = "inbox_dead_letter_archive"
OUTBOX_NOTIFY_CHANNEL: Final = "inbox_outbox"
"""The PostgreSQL ``LISTEN`` channel an outbox table notifies when rows are committed."""
HANDLER_NAME_MAX_LENGTH: Final = 255
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# PostgreSQL's identifier limit (MySQL/MariaDB allow 64, SQLite has none).
_MAX_IDENTIFIER_LENGTH: Final = 63


def _handler_name_type() -> String:
    # MySQL/MariaDB compare VARCHARs with the server's collation, usually case- and
    # accent-insensitive: "billing.Charge" and "billing.charge" would share one claim, and
    # the second handler would never run. A binary collation compares exact characters.
    # (Trailing spaces still compare equal under PAD SPACE; names with them are refused.)
    return _text(HANDLER_NAME_MAX_LENGTH)


def _long_text() -> Text:
    # MySQL's TEXT stops at 64 KiB; an error text or a stored result may be longer.
    return with_family_types(Text(), "long_text")


def _text(length: int) -> String:
    # Whatever the server's default character set, any Unicode text fits.
    return with_family_types(String(length), "text", length)


def _check_identifiers(what: str, name: str, schema: str | None) -> None:
    for label, value in (("table name", name), ("schema", schema)):
        if value is not None and not _IDENTIFIER.fullmatch(value):
            raise ConfigurationError(
                f"{what} {label} must be a plain identifier (letters, digits, underscore; "
                f"at most 63 characters), got {value!r}"
            )


def inbox_table(
    metadata: MetaData, name: str = DEFAULT_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define the inbox table on ``metadata`` under ``name`` (and optional ``schema``).

    Use this to put the inbox table into your own metadata, e.g. with another name.
    ``name`` and ``schema`` must be plain identifiers (letters, digits, underscores).
    """
    _check_identifiers("inbox", name, schema)
    return Table(
        name,
        metadata,
        Column("message_id", BinaryUUID(), primary_key=True),
        Column("handler", _handler_name_type(), primary_key=True),
        Column("processed_at", UTCDateTime(), nullable=False),
        Index(processed_at_index_name(name), "processed_at"),
        schema=schema,
    )


def processed_at_index_name(table_name: str) -> str:
    """The name of the ``processed_at`` index of the inbox table ``table_name``:
    ``ix_<table>_processed_at``, or, where that would pass 63 characters (PostgreSQL and
    MySQL/MariaDB refuse longer names), the table name cut short and a digest of it whole."""
    return _index_name(table_name, "processed_at")


def _index_name(table_name: str, suffix: str) -> str:
    name = f"ix_{table_name}_{suffix}"
    if len(name) <= _MAX_IDENTIFIER_LENGTH:
        return name
    digest = hashlib.sha256(table_name.encode()).hexdigest()[:8]
    keep = _MAX_IDENTIFIER_LENGTH - len(f"ix___{digest}_{suffix}")
    return f"ix_{table_name[:keep]}_{digest}_{suffix}"


def outbox_table(
    metadata: MetaData, name: str = DEFAULT_OUTBOX_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define an outbox table on ``metadata``: one row per message an application
    transaction published, sent by the relay after that transaction committed.

    On PostgreSQL the table notifies :data:`OUTBOX_NOTIFY_CHANNEL` from a statement-level
    trigger, so a listening relay wakes when a publishing transaction commits.
    """
    _check_identifiers("outbox", name, schema)
    table = Table(
        name,
        metadata,
        Column("id", BinaryUUID(), primary_key=True),
        Column("type", _text(255), nullable=False),
        Column("exchange", _text(255), nullable=False),
        Column("routing_key", _text(255), nullable=False),
        Column("content_type", _text(255), nullable=False),
        Column("content_encoding", _text(64), nullable=True),
        Column("headers", _long_text(), nullable=False),
        Column(
            "body",
            with_family_types(LargeBinary(), "blob"),
            nullable=False,
        ),
        Column("created_at", UTCDateTime(), nullable=False),
        Column("attempts", Integer(), nullable=False, default=0, server_default="0"),
        Column("available_at", UTCDateTime(), nullable=False),
        Column("last_error", _long_text(), nullable=True),
        schema=schema,
    )
    for ddl in NOTIFY_DDL:
        event.listen(table, "after_create", ddl)
    return table


def effect_table(
    metadata: MetaData, name: str = DEFAULT_EFFECT_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define an effect table on ``metadata``: the ledger of calls handlers made outside
    the database through ``Inbox.effect``, one row per (claim key, handler, step)."""
    _check_identifiers("effect", name, schema)
    return Table(
        name,
        metadata,
        Column("effect_key", BinaryUUID(), primary_key=True),
        Column("claim_key", BinaryUUID(), nullable=False),
        Column("handler", _handler_name_type(), nullable=False),
        Column("step", _handler_name_type(), nullable=False),
        Column("status", _text(16), nullable=False),
        Column("attempts", Integer(), nullable=False),
        Column("result", _long_text(), nullable=True),
        Column("error", _long_text(), nullable=True),
        Column("started_at", UTCDateTime(), nullable=False),
        Column("updated_at", UTCDateTime(), nullable=False),
        Index(_index_name(name, "claim"), "claim_key", "handler"),
        schema=schema,
    )


def result_table(
    metadata: MetaData, name: str = DEFAULT_RESULT_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define a task result table on ``metadata``: the return value of each Celery inbox
    task per claim (:mod:`inbox.celery`), deleted by ``inbox-cleanup`` by age."""
    _check_identifiers("result", name, schema)
    return Table(
        name,
        metadata,
        Column("claim_key", BinaryUUID(), primary_key=True),
        Column("task", _handler_name_type(), primary_key=True),
        Column("result", _long_text(), nullable=False),
        Column("stored_at", UTCDateTime(), nullable=False),
        Index(_index_name(name, "stored_at"), "stored_at"),
        schema=schema,
    )


def archive_table(
    metadata: MetaData, name: str = DEFAULT_ARCHIVE_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define a dead-letter archive table on ``metadata``: the dead letters an operator
    archived (``inbox dlq archive``, ``inbox dlq purge --archive``, the console's *Archive*)
    instead of deleting them, each with its queue, body, headers and properties (JSON),
    why it was dead-lettered, and when and by whom it was archived; restored (replayed) or
    deleted from there, and deleted by ``inbox-cleanup --archive-days`` after that many
    days."""
    _check_identifiers("archive", name, schema)
    return Table(
        name,
        metadata,
        Column("id", BinaryUUID(), primary_key=True),
        Column("queue", _text(255), nullable=False),
        Column("ref", _text(255), nullable=False),
        Column("source", _text(16), nullable=False),
        Column("reason", _text(64), nullable=True),
        Column("error", _long_text(), nullable=True),
        Column("headers", _long_text(), nullable=False),
        Column("properties", _long_text(), nullable=False),
        Column("body", with_family_types(LargeBinary(), "blob"), nullable=False),
        Column("dead_lettered_at", UTCDateTime(), nullable=True),
        Column("archived_at", UTCDateTime(), nullable=False),
        Column("archived_by", _text(255), nullable=False),
        Index(_index_name(name, "archived_at"), "archived_at"),
        schema=schema,
    )


def resolve_table(table: str | Table) -> Table:
    """Return ``table`` itself, or the inbox table named by ``"name"`` or ``"schema.name"``."""
    return _resolve(table, "inbox", {"message_id", "handler", "processed_at"})


def resolve_outbox_table(table: str | Table) -> Table:
    """Return ``table`` itself, or the outbox table named ``"name"`` or ``"schema.name"``."""
    return _resolve(table, "outbox", {"id", "headers", "body", "available_at"})


def resolve_effect_table(table: str | Table) -> Table:
    """Return ``table`` itself, or the effect table named ``"name"`` or ``"schema.name"``."""
    return _resolve(table, "effect", {"effect_key", "claim_key", "status", "attempts"})


def resolve_result_table(table: str | Table) -> Table:
    """Return ``table`` itself, or the task result table named ``"name"`` or ``"schema.name"``."""
    return _resolve(table, "result", {"claim_key", "task", "result", "stored_at"})


_named: dict[tuple[str, str], Table] = {}  # one Table per name: the outbox maps a class on it
_named_lock: Final = threading.Lock()


def _resolve(table: str | Table, what: str, columns: set[str]) -> Table:
    if isinstance(table, Table):
        missing = columns - set(table.c.keys())
        if missing:
            raise ConfigurationError(
                f"table {table.fullname!r} is not an {what} table (no column "
                f"{', '.join(sorted(missing))}); define it with inbox.schema.{what}_table()"
            )
        return table
    if not isinstance(table, str):
        raise ConfigurationError(
            f"table must be a str or a sqlalchemy Table, got {type(table).__name__}"
        )
    default = _DEFAULTS[what]
    if table == default.name:
        return default
    schema, dot, name = table.rpartition(".")
    if dot and not schema:
        raise ConfigurationError(
            f"{what} table must be NAME or SCHEMA.NAME, each a plain identifier, got {table!r}"
        )
    with _named_lock:
        named = _named.get((what, table))
        if named is None:
            build = _BUILDERS[what]
            named = _named[what, table] = build(MetaData(), name, schema=schema or None)
        return named


metadata: Final = MetaData()
"""The metadata holding the default inbox table; include it in your autogenerate target."""

inbox_message: Final = inbox_table(metadata)
"""The default inbox table, ``inbox_message``."""

outbox_message: Final = outbox_table(metadata)
"""The default outbox table, ``outbox_message``."""

inbox_effect: Final = effect_table(metadata)
"""The default effect table, ``inbox_effect``."""

inbox_task_result: Final = result_table(metadata)
"""The default task result table, ``inbox_task_result`` (Celery inbox tasks' return values)."""

inbox_dead_letter_archive: Final = archive_table(metadata)
"""The default dead-letter archive table, ``inbox_dead_letter_archive``."""

_DEFAULTS: Final = {
    "inbox": inbox_message,
    "outbox": outbox_message,
    "effect": inbox_effect,
    "result": inbox_task_result,
}
_BUILDERS: Final = {
    "inbox": inbox_table,
    "outbox": outbox_table,
    "effect": effect_table,
    "result": result_table,
}
