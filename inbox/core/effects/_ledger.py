"""The effect ledger: the state of each effect outside the database, written once on a
blocking ``Connection`` in short transactions of its own (the async inbox runs the same
functions through ``AsyncConnection.run_sync``).

One record per (claim key, handler, step)::

    start   INSERT 'started', attempts=1            -- the database decides: new or not
            conflict → read the record (FOR UPDATE) and decide by it and the mode:
              done                → the stored result, no call
              started | failed    → at-least-once: attempts+1, 'started', call again
                                    at-most-once:  UncertainEffect, no call
            COMMIT, and only then the call
    finish  UPDATE 'done' + result   WHERE attempts = this attempt
    fail    UPDATE 'failed' + error  WHERE attempts = this attempt

The ``attempts`` condition keeps a late write of an attempt that lost its claim (its
connection dropped while the call ran) from overwriting the attempt that took over.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, replace
from typing import Final

from sqlalchemy import Connection, Insert, Table, Update, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from inbox._backends import Family, backend_for, families
from inbox.core.effects._identity import EffectMode, EffectRef
from inbox.errors import UncertainEffect
from inbox.telemetry import record_effect

__all__ = ["Call", "Ledger", "ResultTooLarge", "Stored"]

# Results shorter than this are sent without looking at max_allowed_packet (whose least
# value on a server is 1 KiB, and default 16 MiB or more).
_PACKET_CHECK_FROM: Final = 64 * 1024
# The UPDATE around the result, and its other parameters, on the wire.
_STATEMENT_OVERHEAD: Final = 1024
STARTED: Final = "started"
DONE: Final = "done"
FAILED: Final = "failed"


class ResultTooLarge(Exception):
    """A result the database would refuse to take: on MySQL/MariaDB, a statement over the
    connection's ``max_allowed_packet`` (the server would drop the connection, which looks
    like a transient error, rather than answer). Nothing was sent."""


@dataclass(frozen=True, slots=True)
class Call:
    """Start decided: make the call, as attempt number ``attempt`` (committed as started)."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Stored:
    """Start decided: the effect is done; ``result`` is its stored JSON text."""

    result: str


class Ledger:
    """The statements of one effect table, and the state machine written with them."""

    def __init__(self, table: Table) -> None:
        self.table = table
        c = table.c
        this = c.effect_key == bindparam("k", type_=c.effect_key.type)
        self._whose = select(c.claim_key, c.handler, c.step).where(this)
        self._whose_any = select(c.effect_key, c.claim_key, c.handler, c.step).where(
            c.effect_key.in_(bindparam("keys", expanding=True))
        )
        self._read = (
            select(c.status, c.attempts, c.result, c.updated_at).where(this).with_for_update()
        )
        at = bindparam("at", type_=c.updated_at.type)
        self._again = (
            update(table).where(this).values(status=STARTED, attempts=bindparam("n"), updated_at=at)
        )
        mine = (this, c.attempts == bindparam("attempt"))
        self._done = (
            update(table)
            .where(*mine)
            .values(status=DONE, result=bindparam("result"), updated_at=at)
        )
        # Per database family: its insert-or-ignore on the effect key (None: a plain insert).
        self._inserts: dict[Family, Insert | None] = {}
        self._failed = (
            update(table)
            .where(*mine)
            .values(status=FAILED, error=bindparam("error"), updated_at=at)
        )

    def resolve(self, connection: Connection, ref: EffectRef) -> EffectRef:
        """``ref``, or ``ref`` under its version-1 key when an earlier version recorded this
        very effect there (the record's claim key, handler and step are ``ref``'s; another
        effect that shared the key is never taken for it). With ``ref.earlier`` set, the same
        read looks under all three: a record of ``ref.key`` first, then version 1, then
        ``earlier``. One read, for effects whose key changed only."""
        if ref.legacy is None:
            return ref
        _one_round_trip(connection)
        whose = (uuid.UUID(bytes=ref.claim_key), ref.handler, ref.step)
        if ref.earlier is None:
            with connection.begin():
                found = connection.execute(self._whose, {"k": ref.legacy}).one_or_none()
            mine = found is not None and tuple(found) == whose
            return replace(ref, key=ref.legacy if mine else ref.key, legacy=None)
        keys = [ref.key, ref.legacy, ref.earlier]
        with connection.begin():
            rows = connection.execute(self._whose_any, {"keys": keys}).all()
        recorded = {row[0] for row in rows if tuple(row[1:]) == whose}
        key = next((k for k in keys if k in recorded), ref.key)
        return replace(ref, key=key, legacy=None, earlier=None)

    def start(
        self, connection: Connection, ref: EffectRef, mode: EffectMode, at: dt.datetime
    ) -> Call | Stored:
        """Record the effect as started and commit, or find it recorded: what to do now.

        ``at`` stamps the write; a re-run of this start after an error whose COMMIT did land
        finds its own stamp on a 'started' record and goes on as that attempt, rather than
        taking its own record for an earlier attempt's.
        """
        try:
            decided = self._start(connection, ref, mode, at)
        except UncertainEffect:
            record_effect("uncertain", ref.handler, ref.step)
            raise
        outcome = "stored" if isinstance(decided, Stored) else "started"
        record_effect(outcome, ref.handler, ref.step)
        return decided

    def _start(
        self, connection: Connection, ref: EffectRef, mode: EffectMode, at: dt.datetime
    ) -> Call | Stored:
        row = self._row(ref, at)
        family = families[type(connection.dialect)]
        statement = self._insert_statement(family)
        inserted = None
        if statement is not None and family.commits_single_writes_itself:
            inserted = backend_for(connection.dialect).write_alone(connection, statement, row)
        if inserted is None:  # the ordinary way
            _one_round_trip(connection)
            with connection.begin():
                if self._insert(connection, row):
                    return Call(1)
        elif inserted == 1:
            return Call(1)
        # Recorded already (a retry): decide in a real transaction, the record locked.
        if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            connection.execution_options(isolation_level=connection.default_isolation_level)
        with connection.begin():
            status, attempts, result, updated_at = connection.execute(
                self._read, {"k": ref.key}
            ).one()
            if status == DONE:
                if result is None:
                    raise UncertainEffect(
                        ref.key,
                        ref.handler,
                        ref.step,
                        status=status,
                        attempts=attempts,
                        why="it was made, but its result could not be stored (not JSON, or "
                        "refused by the database as too large), so the handler cannot be given "
                        "it and it must not be made again",
                    )
                return Stored(result)
            if status == STARTED and updated_at == at:
                return Call(attempts)  # our own start, committed before an error hid it
            if mode is EffectMode.AT_MOST_ONCE:
                raise UncertainEffect(
                    ref.key,
                    ref.handler,
                    ref.step,
                    status=status,
                    attempts=attempts,
                    why="an earlier attempt started it and did not record it done; "
                    "at-most-once never calls again",
                )
            connection.execute(self._again, {"k": ref.key, "n": attempts + 1, "at": at})
            return Call(attempts + 1)

    def finish(
        self,
        connection: Connection,
        ref: EffectRef,
        attempt: int,
        result: str | None,
        at: dt.datetime,
    ) -> bool:
        """Record ``attempt`` done with ``result`` (None: made, but the result could not be
        stored); False if a later attempt has taken the record over."""
        if result is not None and len(result) >= _PACKET_CHECK_FROM:
            _check_packet_size(connection, result)
        params = {"k": ref.key, "attempt": attempt, "result": result, "at": at}
        written = self._write_end(connection, self._done, params)
        if written:
            record_effect("done", ref.handler, ref.step)
        return written

    def fail(
        self, connection: Connection, ref: EffectRef, attempt: int, error: str, at: dt.datetime
    ) -> bool:
        """Record ``attempt`` failed with ``error``; False if a later attempt has taken the
        record over."""
        params = {"k": ref.key, "attempt": attempt, "error": error, "at": at}
        written = self._write_end(connection, self._failed, params)
        if written:
            record_effect("failed", ref.handler, ref.step)
        return written

    @staticmethod
    def _write_end(connection: Connection, statement: Update, params: dict[str, object]) -> bool:
        if families[type(connection.dialect)].commits_single_writes_itself:
            written = backend_for(connection.dialect).write_alone(connection, statement, params)
            if written is not None:
                return written == 1
        _one_round_trip(connection)
        with connection.begin():
            result = connection.execute(
                statement, params, execution_options={"preserve_rowcount": True}
            )
            return result.rowcount == 1

    @staticmethod
    def _row(ref: EffectRef, at: dt.datetime) -> dict[str, object]:
        return {
            "effect_key": ref.key,
            "claim_key": ref.claim_key,
            "handler": ref.handler,
            "step": ref.step,
            "status": STARTED,
            "attempts": 1,
            "started_at": at,
            "updated_at": at,
        }

    def _insert_statement(self, family: Family) -> Insert | None:
        """The family's insert-or-ignore on the effect key (None: a plain insert)."""
        try:
            return self._inserts[family]
        except KeyError:
            statement = self._inserts[family] = family.insert_or_ignore(self.table, "effect_key")
            return statement

    def _insert(self, connection: Connection, row: dict[str, object]) -> bool:
        """Insert the started record ``row``: True if inserted, False if it was there already.

        Insert-or-ignore on the primary key only, as the claim does: a violation of any
        other constraint is an error, never mistaken for an existing record.
        """
        family = families[type(connection.dialect)]
        statement = self._insert_statement(family)
        if statement is not None:
            return connection.execute(statement, row).rowcount == 1
        try:
            connection.execute(insert(self.table), row)
        except IntegrityError as exc:
            if family.is_duplicate_key(exc):
                return False
            raise
        return True


def _check_packet_size(connection: Connection, result: str) -> None:
    """Where the server limits a statement's size (MySQL/MariaDB's ``max_allowed_packet``),
    raise :class:`ResultTooLarge` before sending a statement with ``result`` that the
    connection would not take. The result is ASCII JSON; its quotes and backslashes go
    escaped."""
    family = families[type(connection.dialect)]
    if not family.limits_statements:
        return
    limit = family.statement_limit(connection)
    escaped = sum(result.count(quote) for quote in ("'", '"', "\\"))
    size = len(result) + escaped + _STATEMENT_OVERHEAD
    if limit and size > limit:
        raise ResultTooLarge(
            f"the result takes about {size} bytes on the wire, more than the connection's "
            f"max_allowed_packet ({limit} bytes)"
        )


def _one_round_trip(connection: Connection) -> None:
    """Where the family says so (PostgreSQL), let a single-statement write commit itself:
    one round trip instead of BEGIN, the statement and COMMIT (the drivers switch to
    autocommit without a message to the server). MySQL's drivers would spend more round
    trips switching than they save."""
    family = families[type(connection.dialect)]
    if family.commits_single_writes_itself and not connection.in_transaction():
        connection.execution_options(isolation_level="AUTOCOMMIT")
