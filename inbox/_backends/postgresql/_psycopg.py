"""PostgreSQL through psycopg 3: BEGIN and the server-prepared claim in one round trip, and
the transaction's end read from what the server reported.

A handler transaction is ``BEGIN; claim; <handler>; COMMIT``. Here the first two go out
together on the libpq connection (:mod:`inbox._backends.postgresql._libpq`): the handler
transaction makes exactly the round trips of the handler's own transaction. The claim is a named
prepared statement of its own (``_inbox_claim_N``, parsed once per connection), so the
server neither parses nor plans it per message.

Before the COMMIT, :meth:`PsycopgBackend.state` reads libpq's transaction status and the
marker the claim set (:data:`~inbox._backends.postgresql._claims.MARKER`): both local,
no round trip.

Anything unexpected on the fast path (a statement the server no longer knows, an error
answer, a connection that is not idle) sends the claim the ordinary way instead, through
SQLAlchemy, which then raises exactly what SQLAlchemy raises (and invalidates a lost
connection). Off with ``execution_options={"inbox_share_round_trips": False}`` on the
engine, or where libpq has no pipeline mode (before 14).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Connection, Dialect, Table
from sqlalchemy.dialects.postgresql.base import PGDialect

from inbox._backends._autocommit import refuse_autocommit
from inbox._backends._base import Backend, Claimed, ClaimRow, TransactionState
from inbox._backends._base import statement_listeners as _statement_listeners
from inbox._backends._claims import Claims, translation_key, won
from inbox._backends._waits import drive, drive_async
from inbox._backends.postgresql._alone import write_alone
from inbox._backends.postgresql._claims import MARKER, marked_claim
from inbox._backends.postgresql._libpq import (
    ClaimText,
    PipelineFailed,
    begin_and_claim,
    simple_command,
)
from inbox._backends.postgresql._psycopg2 import LIBPQ_IDLE, LIBPQ_IN_TRANSACTION, state_from

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.sql import ClauseElement

__all__ = ["OPTION", "PsycopgBackend"]

OPTION: Final = "inbox_share_round_trips"
"""The engine execution option that turns the one-round-trip claim off when False."""

logger = logging.getLogger("inbox.claim")

_MARKER: Final = MARKER.encode()
_ON: Final = b"on"
_PREPARED: Final = "inbox.prepared_claims"  # names prepared on a pooled connection (its info)
_NUMBERED: Final[Dialect] = PGDialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
# (renders $1, $2, $3: the placeholders libpq takes)
_ISOLATION: Final = {
    1: b"READ UNCOMMITTED",
    2: b"READ COMMITTED",
    3: b"REPEATABLE READ",
    4: b"SERIALIZABLE",
}  # psycopg.IsolationLevel, by value
_UTF8: Final = b"UTF8"
_names = itertools.count()
_names_lock = threading.Lock()


class PsycopgBackend(Backend):
    """psycopg 3, blocking and asyncio: the claim pipelined with BEGIN on the libpq
    connection, the transaction's state read from libpq."""

    refuses_autocommit = True  # _fast_path reads the same settings anyway

    def __init__(self) -> None:
        import psycopg

        self._pipelines = psycopg.Pipeline.is_supported()
        self._texts: dict[tuple[Table, Hashable], ClaimText] = {}

    # -- begin and claim -------------------------------------------------------------------

    def begin_and_claim(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        """BEGIN and the claim in one round trip when the connection is idle; else (or on
        anything unexpected) the claim through SQLAlchemy."""
        fast = self._fast_path(connection, claims, row)
        if fast is None:
            return self._claim_as_usual(connection, claims, row)
        pgconn, protocol, parse, name, info = fast
        before = pgconn.parameter_status(_MARKER)  # the session's own value of it
        try:
            count = drive(protocol, pgconn.socket)
        except PipelineFailed as failed:
            self._after_failure(info, failed, name)
            with contextlib.suppress(Exception):  # the claim below reports a lost connection
                drive(simple_command(pgconn, b"ROLLBACK"), pgconn.socket)
            return self._claim_as_usual(connection, claims, row)
        except Exception:
            if pgconn.status == _CONNECTION_OK:
                _discard_if_stuck(connection, pgconn)
                raise
            # The connection is lost: the usual claim raises what SQLAlchemy raises for
            # that, and invalidates the connection, so the inbox retries on a fresh one.
            return self._claim_as_usual(connection, claims, row)
        except BaseException:
            _discard_if_stuck(connection, pgconn)
            raise
        return self._claimed(pgconn, info, (parse, name, before), count)

    async def begin_and_claim_async(
        self,
        session: AsyncSession,
        connection: Connection,
        claims: Claims,
        row: ClaimRow,
    ) -> Claimed:
        """:meth:`begin_and_claim` with psycopg's ``AsyncConnection`` underneath: the same
        protocol, awaited on the event loop."""
        fast = self._fast_path(connection, claims, row)
        if fast is None:
            return await session.run_sync(_as_usual, self, connection, claims, row)
        pgconn, protocol, parse, name, info = fast
        before = pgconn.parameter_status(_MARKER)
        try:
            count = await drive_async(protocol, pgconn.socket)
        except PipelineFailed as failed:
            self._after_failure(info, failed, name)
            with contextlib.suppress(Exception):
                await drive_async(simple_command(pgconn, b"ROLLBACK"), pgconn.socket)
            return await session.run_sync(_as_usual, self, connection, claims, row)
        except Exception:
            if pgconn.status == _CONNECTION_OK:
                if pgconn.pipeline_status:
                    await session.run_sync(_invalidate, connection)
                raise
            return await session.run_sync(_as_usual, self, connection, claims, row)
        except BaseException:
            if pgconn.pipeline_status:
                await session.run_sync(_invalidate, connection)
            raise
        return self._claimed(pgconn, info, (parse, name, before), count)

    def _fast_path(
        self, connection: Connection, claims: Claims, row: ClaimRow
    ) -> tuple[Any, Any, bool, bytes, dict[Any, Any]] | None:
        """The libpq connection and the protocol that begins and claims on it, or None where
        the claim must go the ordinary way."""
        options = connection.get_execution_options()
        fairy = connection.connection
        # Blocking psycopg: the DBAPI connection is psycopg's own (asyncio: SQLAlchemy's
        # adapter around it, and driver_connection the AsyncConnection).
        driver: Any = (
            fairy.driver_connection if connection.dialect.is_async else fairy.dbapi_connection
        )
        pgconn = driver.pgconn
        if driver.autocommit or options.get("isolation_level") == "AUTOCOMMIT":
            refuse_autocommit(connection)
        if (
            not self._pipelines
            or options.get(OPTION) is False
            or pgconn.transaction_status != LIBPQ_IDLE
            # Statement listeners (tracing, logging) see the claim: it goes their way.
            or _statement_listeners(connection)
        ):
            return None
        translate = options.get(_TRANSLATE)
        text = (
            self._texts.get((claims.table, None))
            if translate is None
            else self._texts.get((claims.table, translation_key(translate)))
        )
        if text is None:
            text = self._render(claims, translate)
        info = fairy.info
        prepared: set[bytes] | None = info.get(_PREPARED)
        if driver.prepare_threshold is None:  # the application turned preparing off
            name, parse = b"", False
            text = ClaimText(text.sql, b"")
        else:
            name = text.name
            parse = prepared is None or name not in prepared
        encoding = pgconn.parameter_status(b"client_encoding")
        key, handler, at = row
        params = [
            key,
            handler.encode() if encoding == _UTF8 else handler.encode(driver.info.encoding),
            at.isoformat().encode(),
        ]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("BEGIN and %s in one round trip: %r", text.name or b"claim", params)
        # What psycopg itself sends to begin a transaction, from its public settings.
        isolation, read_only = driver.isolation_level, driver.read_only
        deferrable = driver.deferrable
        begin = (
            b"BEGIN"
            if isolation is None and read_only is None and deferrable is None
            else _begin_statement(isolation, read_only, deferrable)
        )
        return pgconn, begin_and_claim(pgconn, begin, text, params, parse=parse), parse, name, info

    def _claimed(
        self, pgconn: Any, info: dict[Any, Any], sent: tuple[bool, bytes, bytes], count: int
    ) -> Claimed:
        parse, name, before = sent
        if parse:
            info.setdefault(_PREPARED, set()).add(name)
        # Marked: the server reported the marker on after the claim. Not where the session's
        # own default is already on (with BEGIN READ WRITE): then its end would not show.
        marked = before != _ON and pgconn.parameter_status(_MARKER) == _ON
        return Claimed(won(count), marked, alone=True, handle=pgconn)

    def _claim_as_usual(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        pgconn = _pgconn(connection)
        before = pgconn.parameter_status(_MARKER)
        won_it = claims.claim(connection, *row)
        marked = before != _ON and pgconn.parameter_status(_MARKER) == _ON
        return Claimed(won_it, marked, alone=False, handle=pgconn)

    def _after_failure(self, info: dict[Any, Any], failed: PipelineFailed, name: bytes) -> None:
        states = {_sqlstate(result) for result in failed.results}
        prepared: set[bytes] = info.setdefault(_PREPARED, set())
        if _NO_SUCH_STATEMENT in states:  # deallocated under us (psycopg's DEALLOCATE ALL)
            prepared.discard(name)
        elif _STATEMENT_EXISTS in states:
            prepared.add(name)
        logger.debug("the one-round-trip claim failed (%s); claiming the usual way", states)

    def _render(self, claims: Claims, translate: Any) -> ClaimText:
        kwargs: dict[str, Any] = {}
        if translate:
            kwargs = {"schema_translate_map": translate, "render_schema_translate": True}
        compiled = marked_claim(claims.table).compile(dialect=_NUMBERED, **kwargs)
        if list(compiled.positiontup or ()) != ["message_id", "handler", "processed_at"]:
            raise AssertionError(f"unexpected claim parameters {compiled.positiontup}")
        with _names_lock:
            name = f"_inbox_claim_{next(_names)}".encode()
        text = ClaimText(str(compiled).encode(), name)
        self._texts[(claims.table, translation_key(translate))] = text
        return text

    # -- the transaction's state, and its end ---------------------------------------------

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """From libpq's transaction status and the marker, both kept by libpq."""
        pgconn = claimed.handle or _pgconn(connection)
        return state_from(
            pgconn.transaction_status, pgconn.parameter_status(_MARKER), claimed.marked, _ON
        )

    def end_duplicate(self, connection: Connection, claimed: Claimed) -> bool:
        """ROLLBACK on the libpq connection: psycopg's own rollback() would also deallocate
        every prepared statement of the connection (the application's too), as it does
        after any rollback once one was prepared."""
        pgconn = claimed.handle
        if not claimed.alone or pgconn.transaction_status != LIBPQ_IN_TRANSACTION:
            return False
        try:
            drive(simple_command(pgconn, b"ROLLBACK"), pgconn.socket)
        except Exception:
            return False
        return True

    async def end_duplicate_async(
        self, session: AsyncSession, connection: Connection, claimed: Claimed
    ) -> bool:
        """:meth:`end_duplicate`, awaited."""
        pgconn = claimed.handle
        if not claimed.alone or pgconn.transaction_status != LIBPQ_IN_TRANSACTION:
            return False
        try:
            await drive_async(simple_command(pgconn, b"ROLLBACK"), pgconn.socket)
        except Exception:
            return False
        return True

    def write_alone(
        self, connection: Connection, statement: ClauseElement, params: Mapping[str, object]
    ) -> int | None:
        """On the libpq connection: :func:`~inbox._backends.postgresql._alone.write_alone`."""
        return write_alone(connection, statement, params)

    def before_claims(self, connection: Connection) -> None:
        """A batch's claims go through SQLAlchemy: refuse autocommit first."""
        refuse_autocommit(connection)

    def before_rollback(self, connection: Connection) -> None:
        """psycopg's rollback() deallocates every prepared statement once it prepared one
        itself: the claim is parsed again on this connection's next transaction."""
        connection.connection.info.pop(_PREPARED, None)


_TRANSLATE: Final = "schema_translate_map"
_CONNECTION_OK: Final = 0  # libpq CONNECTION_OK
_NO_SUCH_STATEMENT: Final = b"26000"
_STATEMENT_EXISTS: Final = b"42P05"


def _sqlstate(result: Any) -> bytes | None:
    sqlstate: bytes | None = result.error_field(ord("C"))  # PG_DIAG_SQLSTATE
    return sqlstate


def _begin_statement(isolation: Any, read_only: bool | None, deferrable: bool | None) -> bytes:
    parts = [b"BEGIN"]
    if isolation is not None:
        parts.append(b"ISOLATION LEVEL " + _ISOLATION[int(isolation)])
    if read_only is not None:
        parts.append(b"READ ONLY" if read_only else b"READ WRITE")
    if deferrable is not None:
        parts.append(b"DEFERRABLE" if deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def _pgconn(connection: Connection) -> Any:
    return connection.connection.driver_connection.pgconn  # type: ignore[union-attr]


def _discard_if_stuck(connection: Connection, pgconn: Any) -> None:
    # Cut short mid-pipeline (a KeyboardInterrupt, a lost connection): the connection may
    # hold answers nobody will read, so it must never go back to the pool.
    if pgconn.pipeline_status:
        connection.invalidate()


def _as_usual(
    _session: object, backend: PsycopgBackend, connection: Connection, claims: Claims, row: ClaimRow
) -> Claimed:
    return backend._claim_as_usual(connection, claims, row)


def _invalidate(_session: object, connection: Connection) -> None:
    connection.invalidate()
