"""MySQL and MariaDB through PyMySQL: the claim sent on the driver's own connection, the
statement PyMySQL would be given by SQLAlchemy, without SQLAlchemy's statement machinery
(some 80 Python calls a message).

The ``INSERT`` is rendered once per table, dialect and schema translation, by SQLAlchemy's
compiler; its three values go through the columns' own bind processors and PyMySQL's
``Connection.escape``, which is what ``Cursor.execute`` escapes each parameter with; then
``Connection.query`` sends it and reads the answer. Error 1062 on the PRIMARY key is the
duplicate, as on the usual path. Any other error goes through SQLAlchemy's own handling of a
failed statement (``Connection._handle_dbapi_exception``): wrapped in the same exception,
``handle_error`` listeners run (the backend remembers a deadlock there), a lost connection
invalidated. Where statement listeners (tracing, logging) would see the claim, it goes their
way, through SQLAlchemy, as it does when the connection is not exactly PyMySQL's class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any, Final, NamedTuple

from pymysql.err import IntegrityError as DriverIntegrityError
from sqlalchemy import Connection, Dialect, Table

from inbox._backends._base import ClaimRow
from inbox._backends._claims import translation_key
from inbox._backends.mysql._backend import duplicate_primary_key
from inbox.errors import InboxError

__all__ = ["DriverClaim"]

logger = logging.getLogger("inbox.claim")

_TRANSLATE: Final = "schema_translate_map"
_COLUMNS: Final = ("message_id", "handler", "processed_at")


class _ClaimText(NamedTuple):
    sql: str
    """The INSERT with ``%(name)s`` placeholders (the dialect's pyformat)."""
    processors: tuple[Callable[[Any], Any] | None, ...]
    """The columns' bind processors, in :data:`_COLUMNS` order."""


class DriverClaim:
    """The claim on PyMySQL's connection, its statement texts kept per table, dialect and
    schema translation."""

    def __init__(self) -> None:
        self._texts: dict[tuple[Table, Dialect, Hashable], _ClaimText] = {}

    def claim(self, connection: Connection, driver: Any, table: Table, row: ClaimRow) -> bool:
        """Insert the claim ``row`` into ``table`` on ``driver`` (``connection``'s PyMySQL
        connection, in the transaction SQLAlchemy began): True if won, False if a duplicate;
        any other error raised as SQLAlchemy raises it."""
        translate = connection.get_execution_options().get(_TRANSLATE)
        dialect = connection.dialect
        text = self._texts.get(
            (table, dialect, None if translate is None else translation_key(translate))
        )
        if text is None:
            text = self._render(table, dialect, translate)
        key, handler, at = row
        process_key, process_handler, process_at = text.processors
        params = {
            "message_id": key if process_key is None else process_key(key),
            "handler": handler if process_handler is None else process_handler(handler),
            "processed_at": at if process_at is None else process_at(at),
        }
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("claim on the driver's connection: %r", params)
        escape = driver.escape
        try:
            count = driver.query(
                text.sql
                % {
                    "message_id": escape(params["message_id"]),
                    "handler": escape(params["handler"]),
                    "processed_at": escape(params["processed_at"]),
                }
            )
        except DriverIntegrityError as exc:
            if duplicate_primary_key(exc.args):
                return False
            connection._handle_dbapi_exception(exc, text.sql, params, None, None)
        except BaseException as exc:
            # Wrapped, listeners told, a lost connection invalidated: as through execute().
            connection._handle_dbapi_exception(exc, text.sql, params, None, None)
        if count != 1:
            # A plain INSERT of one row that did not fail inserted it: anything else is not
            # understood, and never read as a duplicate (that would drop the message).
            raise InboxError(f"PyMySQL reported {count!r} rows for the claim insert")
        return True

    def _render(self, table: Table, dialect: Dialect, translate: Any) -> _ClaimText:
        kwargs: dict[str, Any] = {}
        if translate:
            kwargs = {"schema_translate_map": translate, "render_schema_translate": True}
        compiled = table.insert().compile(dialect=dialect, column_keys=list(_COLUMNS), **kwargs)
        if compiled.positiontup is not None or set(compiled.binds) != set(_COLUMNS):
            raise InboxError(f"unexpected claim parameters {sorted(compiled.binds)}")
        processors = tuple(table.c[name].type.bind_processor(dialect) for name in _COLUMNS)
        text = _ClaimText(str(compiled), processors)
        self._texts[(table, dialect, translation_key(translate))] = text
        return text
