"""One write that commits itself, sent on the libpq connection psycopg 3 holds: the effect
ledger's records (:mod:`inbox.core.effects._ledger`), each in a transaction of its own.

Through SQLAlchemy such a write is the connection switched to autocommit, the statement
executed and its result read, then the connection's settings restored as it goes back to
its pool: one round trip, and about two hundred Python calls. Sent here it is the same one
round trip (the server runs a lone statement in a transaction of its own and commits it,
exactly as in autocommit) and a tenth of the calls. The statement is rendered once per
table and ``schema_translate_map``, with ``$n`` placeholders, and sent unnamed.

Anything this path does not know goes the ordinary way (``None``): a connection in a
transaction or not idle, statement listeners that should see the statement, the engine
option ``inbox_share_round_trips=False``, a value of a type not encoded here. An error
answer also goes the ordinary way again, which then raises what SQLAlchemy raises (the
statement failed: nothing was committed). A lost connection is invalidated here and raised
as SQLAlchemy raises it (``OperationalError``, ``connection_invalidated``), so the ledger's
callers retry it as they retry any lost connection.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias, cast

from sqlalchemy import Connection, Dialect
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import ClauseElement

from inbox._backends._claims import translation_key
from inbox._backends._waits import drive
from inbox._backends.postgresql._libpq import PipelineFailed, lone_write
from inbox._backends.postgresql._psycopg2 import LIBPQ_IDLE

if TYPE_CHECKING:
    from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["write_alone"]

_NUMBERED: Final[Dialect] = PGDialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
_UTF8: Final = b"UTF8"
_CONNECTION_OK: Final = 0  # libpq CONNECTION_OK
_OPTION: Final = "inbox_share_round_trips"
_TRANSLATE: Final = "schema_translate_map"

_Rendered: TypeAlias = tuple[bytes, tuple[str, ...], dict[str, object]]
# (id of a statement, its parameters' names, translate key) -> (the statement, _Rendered)
_rendered: dict[tuple[int, tuple[str, ...], Hashable], tuple[ClauseElement, _Rendered]] = {}
_rendered_lock = threading.Lock()


class _NotEncoded(Exception):
    """A value of a type this path does not encode: the write goes the ordinary way."""


def write_alone(
    connection: Connection, statement: ClauseElement, params: Mapping[str, object]
) -> int | None:
    """Run ``statement`` with ``params`` as a transaction of its own on ``connection`` (which
    must not be in one) and return its row count; None where it must go through SQLAlchemy.
    """
    if connection.in_transaction() or connection.dialect.is_async:
        return None
    options = connection.get_execution_options()
    if options.get(_OPTION) is False:
        return None
    if connection._has_events or connection.engine._has_events:  # see _base.statement_listeners
        dispatch = connection.engine.dispatch
        if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
            return None
    driver: Any = connection.connection.dbapi_connection
    pgconn = driver.pgconn
    if pgconn.transaction_status != LIBPQ_IDLE:
        return None
    sql, names, fixed = _render(statement, tuple(params), options.get(_TRANSLATE))
    encoding = pgconn.parameter_status(b"client_encoding")
    try:
        given = [params[name] if name in params else fixed[name] for name in names]
        values = _encoded(given, encoding, driver)
    except (_NotEncoded, UnicodeError):
        return None
    try:
        return drive(lone_write(pgconn, sql, values), pgconn.socket)
    except PipelineFailed as failed:
        if pgconn.status == _CONNECTION_OK:
            return None  # the statement failed, nothing was committed: SQLAlchemy says why
        raise _lost(connection, sql, failed) from failed  # a FATAL answer: the server hung up
    except Exception as error:
        if pgconn.status == _CONNECTION_OK:
            connection.invalidate()  # cut short: an answer may be left unread
            raise
        raise _lost(connection, sql, error) from error
    except BaseException:
        connection.invalidate()
        raise


def _lost(connection: Connection, sql: bytes, error: Exception) -> OperationalError:
    """The error SQLAlchemy gives for a connection lost under a statement (invalidated,
    which :func:`inbox.is_transient` counts as transient), the connection invalidated as
    SQLAlchemy would: the ordinary way would now only fail on the dead connection."""
    connection.invalidate(error)
    return OperationalError(sql.decode(), None, error, connection_invalidated=True)


def _render(statement: ClauseElement, keys: tuple[str, ...], translate: Any) -> _Rendered:
    """The statement's SQL with ``$n`` placeholders, its parameters' names in their order,
    and the values the statement holds itself (``values(status="done")``). ``keys``: the
    parameters given, which are the columns an INSERT without ``values()`` sets."""
    key = (id(statement), keys, None if translate is None else translation_key(translate))
    found = _rendered.get(key)
    if found is not None and found[0] is statement:
        return found[1]
    kwargs: dict[str, Any] = {"column_keys": list(keys)}
    if translate:
        kwargs |= {"schema_translate_map": translate, "render_schema_translate": True}
    compiled = cast("SQLCompiler", statement.compile(dialect=_NUMBERED, **kwargs))
    names = tuple(compiled.positiontup or ())
    fixed = {name: compiled.binds[name].effective_value for name in names if name not in keys}
    rendered = (str(compiled).encode(), names, fixed)
    with _rendered_lock:  # the statement is kept with its text: its id is never reused
        _rendered[key] = (statement, rendered)
    return rendered


def _encoded(values: Sequence[object], encoding: bytes | None, driver: Any) -> list[bytes | None]:
    """The values in libpq's text format, as the columns' types bind them (a key as its 16
    bytes, an instant with its zone); :class:`_NotEncoded` for a value of another type. Written for
    as few calls as can be: this runs for every record the ledger writes."""
    params: list[bytes | None] = []
    append = params.append
    for value in values:
        cls = value.__class__
        if cls is str:
            text: str = value  # type: ignore[assignment]
            append(text.encode() if encoding == _UTF8 else text.encode(driver.info.encoding))
        elif value is None:
            append(None)
        elif cls is bytes:
            append(b"\\x" + value.hex().encode())  # type: ignore[attr-defined]
        elif cls is uuid.UUID:
            append(b"\\x%032x" % value.int)  # type: ignore[attr-defined]
        elif cls is int:
            append(b"%d" % value)  # type: ignore[str-format]
        elif cls is dt.datetime and value.tzinfo is not None:  # type: ignore[attr-defined]
            append(value.isoformat().encode())  # type: ignore[attr-defined]
        else:
            raise _NotEncoded(cls.__name__)
    return params
