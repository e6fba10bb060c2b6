"""BEGIN and the claim in one round trip, on the libpq connection psycopg 3 holds.

psycopg documents ``Connection.pgconn`` and its :mod:`psycopg.pq` wrapper for "low level
commands ... not currently wrapped by Psycopg". Pipeline mode there sends ``BEGIN``, the
server-prepared claim (and its ``Parse`` the first time on a connection) and one ``Sync``
together: one round trip for what would otherwise be two. psycopg's own ``Pipeline``
class would do the same with several times the client work, and its implicit ``BEGIN``
waits for its own answer before anything else is sent.

The steps here only speak the protocol; they yield when they must wait on the socket
(:mod:`inbox._backends._waits`), so blocking and async code share them. psycopg's
``Connection`` reads the transaction status from the same libpq connection, so afterwards
it sees an open transaction and manages it as usual (no ``BEGIN`` of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from inbox._backends._waits import READ, READ_WRITE, Protocol

if TYPE_CHECKING:
    from psycopg.pq.abc import PGconn, PGresult

__all__ = ["ClaimText", "PipelineFailed", "begin_and_claim", "lone_write", "simple_command"]

# libpq's values (psycopg.pq.ExecStatus / PipelineStatus), compared without an import.
_COMMAND_OK: Final = 1
_PIPELINE_SYNC: Final = 10
_PIPELINE_OFF: Final = 0
_BINARY: Final = 1
_TEXT: Final = 0
# Lists, not tuples: psycopg 3.1's libpq wrapper takes nothing else.
CLAIM_FORMATS: Final = [_BINARY, _TEXT, _TEXT]
"""The claim's parameters: the 16-byte key in binary, the handler and instant as text."""
CLAIM_TYPES: Final = [17, 1043, 1184]
"""Their types: bytea, varchar, timestamptz."""


@dataclass(frozen=True, slots=True)
class ClaimText:
    """The claim statement as libpq takes it: SQL with ``$n`` placeholders and the name it is
    prepared under on the server (empty: not prepared, parsed with every message)."""

    sql: bytes
    name: bytes


class PipelineFailed(Exception):
    """The pipeline did not run as sent: ``results`` holds what came back (an error result,
    or none when the connection failed before any answer)."""

    def __init__(self, results: Sequence[PGresult]) -> None:
        super().__init__("the BEGIN and claim pipeline failed")
        self.results = results


def begin_and_claim(
    pgconn: PGconn, begin: bytes, claim: ClaimText, params: Sequence[bytes], *, parse: bool
) -> Protocol[int]:
    """Send ``[Parse] BEGIN; claim; Sync`` at once and return the claim's row count (1: won,
    0: a duplicate). Raises :class:`PipelineFailed` if any of them failed."""
    pgconn.enter_pipeline_mode()
    try:
        if parse:
            pgconn.send_prepare(claim.name, claim.sql, CLAIM_TYPES)
        pgconn.send_query_params(begin, None)
        if claim.name:
            pgconn.send_query_prepared(claim.name, params, CLAIM_FORMATS)
        else:
            pgconn.send_query_params(claim.sql, params, CLAIM_TYPES, CLAIM_FORMATS)
        pgconn.pipeline_sync()
        # Written out rather than delegated to helpers: this runs once per message.
        while pgconn.flush():
            yield READ_WRITE
            pgconn.consume_input()  # the server may answer while we still send
        results: list[PGresult] = []
        while True:  # one result per command (each followed by a NULL), then the Sync's
            while pgconn.is_busy():
                yield READ
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue
            if result.status == _PIPELINE_SYNC:
                break
            results.append(result)
    finally:
        _leave_pipeline(pgconn)
    for result in results:
        if result.status != _COMMAND_OK:
            raise PipelineFailed(results)
    return results[-1].command_tuples or 0


def simple_command(pgconn: PGconn, command: bytes) -> Protocol[None]:
    """Send one parameterless command (``ROLLBACK``) and wait for its answer; an error
    result raises :class:`PipelineFailed`."""
    pgconn.send_query(command)
    yield from _flush(pgconn)
    results = []
    while True:
        while pgconn.is_busy():
            yield READ
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        results.append(result)
    if any(result.status != _COMMAND_OK for result in results):
        raise PipelineFailed(results)


def lone_write(pgconn: PGconn, sql: bytes, params: Sequence[bytes | None]) -> Protocol[int]:
    """Send one statement, unnamed, with ``params`` in text format (their types inferred
    by the server), outside any transaction (the server runs and commits it alone), and
    return its row count; an error result raises :class:`PipelineFailed`."""
    pgconn.send_query_params(sql, params)
    # The flush and the result loop are written out here and in simple_command, not shared:
    # a helper generator costs each write 3 Python calls (measured: blocking/effect +383 ->
    # +389, blocking/duplicate -108 -> -106 in tests/test_cost_budgets.py).
    while pgconn.flush():
        yield READ_WRITE
        pgconn.consume_input()  # the server may answer while we still send
    results = []
    while True:
        while pgconn.is_busy():
            yield READ
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        results.append(result)
    for result in results:  # a loop, not any(): no generator per write
        if result.status != _COMMAND_OK:
            raise PipelineFailed(results)
    if not results:
        raise PipelineFailed(results)
    return results[-1].command_tuples or 0


def _flush(pgconn: PGconn) -> Protocol[None]:
    while pgconn.flush():
        yield READ_WRITE
        pgconn.consume_input()  # the server may answer while we still send


def _leave_pipeline(pgconn: PGconn) -> None:
    if pgconn.pipeline_status != _PIPELINE_OFF:
        # Fails only with results still pending (the protocol was cut short: a lost
        # connection, a cancellation): the caller then discards the connection. No
        # contextlib.suppress: three calls more on every message.
        try:  # noqa: SIM105
            pgconn.exit_pipeline_mode()
        except Exception:  # psycopg.OperationalError
            pass
