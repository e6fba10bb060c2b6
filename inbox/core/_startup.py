"""The check a process runs before it takes work: are the inbox's tables there, and at the
revision this version of the library needs?

Two ways to have made the tables are accepted. Alembic (the shipped revisions, run by the
repository's ``alembic.ini`` into ``inbox_alembic_version``, or by an application's own
history into ``alembic_version``): a version table that records an inbox revision older than
this version's head fails the check, naming the upgrade to run. ``metadata.create_all`` (or
a revision of the application's own, such as the partitioned table): no version table
records an inbox revision, so the tables themselves are read and every column this version
uses must exist. The columns are checked in the alembic case too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sqlalchemy import Connection, Engine, Select, Table, column, inspect, select, table
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, UnboundExecutionError

from inbox._backends import is_unreachable_error
from inbox.errors import InboxError
from inbox.schema import inbox_effect

if TYPE_CHECKING:
    from inbox.core._registration import AnyInbox

__all__ = [
    "APP_VERSION_TABLE",
    "INBOX_VERSION_TABLE",
    "MIGRATE_HINT",
    "SchemaNotReady",
    "check_schema",
    "effect_store",
    "inbox_engine",
    "inbox_revisions",
    "required_revision",
    "server_unreachable",
    "wait_for_schema",
    "worker_engine",
    "worker_tables",
]

INBOX_VERSION_TABLE: Final = "inbox_alembic_version"
"""The version table of the repository's ``alembic.ini`` (the shipped revisions alone)."""
APP_VERSION_TABLE: Final = "alembic_version"
"""Alembic's default version table: an application history that includes the inbox's."""

_VERSIONS: Final = Path(__file__).resolve().parents[1] / "migrations" / "versions"
_UPGRADE: Final = {
    INBOX_VERSION_TABLE: "inbox migrate",
    APP_VERSION_TABLE: "alembic upgrade heads",
}
MIGRATE_HINT: Final = (
    "run the inbox migrations (`inbox migrate`, or `alembic upgrade heads` in an alembic "
    "history of your own, docs/migrations.md)"
)
"""What to do about a database without the inbox's tables, as the error lines say it."""
_CREATE_HINT: Final = f"{MIGRATE_HINT} or inbox.schema.metadata.create_all(engine)"


class SchemaNotReady(InboxError):
    """The inbox's tables are missing, incomplete, or at an older revision than this version
    of the library needs. The message is one line that names the command to run."""


@functools.cache
def inbox_revisions() -> tuple[str, ...]:
    """The shipped inbox revisions, newest first (read from the package's revision files)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(_VERSIONS.parent), version_locations=[str(_VERSIONS)])
    return tuple(revision.revision for revision in script.walk_revisions())


def required_revision() -> str:
    """The inbox revision this version of the library needs: the head of the ``inbox``
    branch it ships."""
    return inbox_revisions()[0]


def check_schema(bind: Engine | Connection, tables: Iterable[Table]) -> None:
    """Raise :class:`SchemaNotReady` unless the database behind ``bind`` is ready for this
    version: no version table records an older inbox revision, and every table in
    ``tables`` exists with all its columns. Database errors propagate.

    The inbox worker checks the inbox and effect tables; a relay passes its outbox table.
    """
    engine = bind.engine if isinstance(bind, Connection) else bind
    wanted = list(tables)
    _check_revision(engine, {t.schema for t in wanted})
    with engine.connect() as connection:
        inspector = inspect(connection)
        for wanted_table in wanted:
            where = (
                f"{wanted_table.schema}.{wanted_table.name}"
                if wanted_table.schema
                else wanted_table.name
            )
            if not inspector.has_table(wanted_table.name, schema=wanted_table.schema):
                raise SchemaNotReady(f"table {where} does not exist: {_CREATE_HINT}")
            present = {
                c["name"].lower()
                for c in inspector.get_columns(wanted_table.name, schema=wanted_table.schema)
            }
            missing = [c.name for c in wanted_table.columns if c.name.lower() not in present]
            if missing:
                raise SchemaNotReady(
                    f"table {where} lacks column(s) {', '.join(missing)} that this version of "
                    f"inbox uses: {_CREATE_HINT.replace('create_all', 'an ALTER TABLE')}"
                )


def wait_for_schema(
    bind: Engine | Connection, tables: Iterable[Table], *, retries: int = 3
) -> None:
    """:func:`check_schema`, retried ``retries`` times (after 2, 4, 6… seconds, at most 30)
    while the database cannot be reached: a process that starts beside a restarting database
    waits, as for the broker. :class:`SchemaNotReady` is never retried."""
    wanted = list(tables)
    for attempt in range(retries + 1):
        try:
            check_schema(bind, wanted)
            return
        except DBAPIError as exc:
            if attempt == retries or not _unreachable(exc):
                raise
        time.sleep(min(2.0 * (attempt + 1), 30.0))


def inbox_engine(session_factory: object, claim_clause: object) -> Engine | None:
    """The engine a session factory's sessions run ``claim_clause`` on, or None when its
    sessions are not bound (yet): then there is nothing to check before the first message."""
    from sqlalchemy.orm import Session

    session = session_factory() if callable(session_factory) else None
    if not isinstance(session, Session):
        return None
    try:
        bind = session.get_bind(clause=claim_clause)  # type: ignore[arg-type]
    except UnboundExecutionError:
        return None
    finally:
        session.close()
    return bind.engine if isinstance(bind, Connection) else bind


def server_unreachable(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says the database server could not
    be reached (see :func:`_unreachable`): a connection attempt that waiting may cure."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, DBAPIError) and _unreachable(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unreachable(exc: DBAPIError) -> bool:
    """Whether ``exc`` says the server could not be reached (refused, down, starting, shutting
    down, the connection lost), which waiting may cure; not a refused login or a missing
    database, which it cannot."""
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    return is_unreachable_error(exc.orig)


def _check_revision(engine: Engine, schemas: set[str | None]) -> None:
    """Fail when a version table records an inbox revision other than the required one."""
    known = inbox_revisions()
    needed = required_revision()
    for schema in sorted(schemas | {None}, key=lambda s: s or ""):
        for version_table in (INBOX_VERSION_TABLE, APP_VERSION_TABLE):
            recorded = _recorded(engine, version_table, schema)
            found = [r for r in recorded if r in known]
            if not found or needed in found:
                continue
            where = f"{schema}.{version_table}" if schema else version_table
            raise SchemaNotReady(
                f"the database is at inbox revision {found[0]} ({where}), this version of inbox "
                f"needs {needed}: run `{_UPGRADE[version_table]}` (docs/migrations.md)"
            )


def _recorded(engine: Engine, version_table: str, schema: str | None) -> list[str]:
    """The revisions ``version_table`` holds; none when it does not exist or cannot be read
    (a worker role without SELECT on it: the columns are checked instead)."""
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table(version_table, schema=schema):
                return []
            query: Select[tuple[str]] = select(column("version_num")).select_from(
                table(version_table, schema=schema)
            )
            return [str(value) for value in connection.execute(query).scalars()]
    except DBAPIError as exc:
        if _unreachable(exc):
            raise
        return []


def worker_engine(inbox: AnyInbox) -> Engine | None:
    """The engine an inbox claims on, or None when its sessions are not bound (yet): then
    there is nothing to check before the first message, which reports that."""
    return inbox_engine(inbox._session_factory, inbox.table.insert())


def worker_tables(inbox: AnyInbox) -> tuple[Table, ...]:
    """The tables a worker for ``inbox`` uses in the inbox's database: its claim table, and
    its effect table unless the effects are kept in a store of their own."""
    store, table = _effects_of(inbox)
    return (inbox.table,) if store is not None else (inbox.table, table)


def effect_store(inbox: AnyInbox) -> tuple[Engine, Table] | None:
    """The engine and effect table of an inbox whose effects are kept in a store of its own
    (``effect_store=``), to check beside the inbox's database; None otherwise."""
    store, table = _effects_of(inbox)
    return None if store is None else (store, table)


def _effects_of(inbox: AnyInbox) -> tuple[Engine | None, Table]:
    effects = getattr(inbox, "_effects", None)  # the inbox's Effects: its store and ledger
    ledger = getattr(effects, "ledger", None)
    table = getattr(ledger, "table", None)
    store = getattr(effects, "_store", None)
    return (
        store if isinstance(store, Engine) else None,
        table if isinstance(table, Table) else inbox_effect,
    )
