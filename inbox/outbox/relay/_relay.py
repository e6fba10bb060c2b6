"""The outbox relay: every committed outbox row goes to the broker, confirmed, then is deleted.

One cycle, in one database transaction::

    SELECT ... WHERE available_at <= now ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED
    publish every row (persistent, mandatory, message_id = row id), then await the confirms
    DELETE the confirmed rows; UPDATE the refused ones (attempts, last_error, available_at)
    COMMIT

A row leaves the table only after the broker confirmed it, so a crash anywhere sends it again
under the same message id (a consumer's inbox skips the copy); a refused row stays, and the
rows behind it go on. The manual is ``docs/outbox.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from types import TracebackType
from typing import Final, Self

from kombu.connection import Connection
from sqlalchemy import Connection as DatabaseConnection
from sqlalchemy import Engine, Table
from sqlalchemy.exc import DBAPIError

from inbox.core._retry import is_transient
from inbox.core._startup import wait_for_schema
from inbox.outbox.relay._listen import Wakeup
from inbox.outbox.relay._options import broker_connection, check_seconds, check_whole, engine_of
from inbox.outbox.relay._publish import BatchPublisher, BrokerLost, Sent
from inbox.outbox.relay._refusals import error_line
from inbox.outbox.relay._rows import OutboxRows, Refusal, Taken, resolve_outbox_table
from inbox.outbox.relay._stats import RelayStats
from inbox.outbox.relay._status import OutboxStatus, outbox_status
from inbox.schema import DEFAULT_OUTBOX_TABLE_NAME
from inbox.telemetry import record_outbox

__all__ = ["OutboxStatus", "Relay", "RelayStats", "outbox_status"]

logger = logging.getLogger("inbox.relay")

MAX_RELAY_BATCH_SIZE: Final = 10_000
_DELETE_RETRIES: Final = 5


class _Stopped(Exception):
    """Raised out of a reconnection loop when the relay was told to stop."""


class Relay:
    """Sends the rows of an outbox table to the broker, in id order, each confirmed.

    ``engine``: a SQLAlchemy ``Engine`` or a database URL (the relay then owns its engine);
    ``broker``: a kombu ``Connection`` (cloned) or a URL; ``table``: the outbox table, a
    ``Table`` or its name (``"schema.name"``). ``batch_size`` rows are taken, published and
    confirmed together; an idle relay waits ``poll_interval`` seconds between looks at the
    table, or less when PostgreSQL notifies it (``listen``). A refused row waits about 1, 2, 4
    ... seconds, at most ``max_retry_delay``, between attempts. Several relays may run at
    once on PostgreSQL and MySQL/MariaDB; on SQLite run one.
    """

    def __init__(
        self,
        engine: Engine | str,
        broker: Connection | str,
        *,
        table: str | Table = DEFAULT_OUTBOX_TABLE_NAME,
        batch_size: int = 100,
        poll_interval: float = 1.0,
        confirm_timeout: float = 30.0,
        max_retry_delay: float = 300.0,
        listen: bool = True,
        stats_interval: float | None = 60.0,
    ) -> None:
        check_whole("batch_size", batch_size, 1, MAX_RELAY_BATCH_SIZE)
        for name, value in (
            ("poll_interval", poll_interval),
            ("confirm_timeout", confirm_timeout),
            ("max_retry_delay", max_retry_delay),
            ("stats_interval", 1.0 if stats_interval is None else stats_interval),
        ):
            check_seconds(name, value)
        self._rows = OutboxRows(resolve_outbox_table(table))
        self._owns_engine = isinstance(engine, str)
        self.engine = engine_of(engine)
        self._publisher = BatchPublisher(broker_connection(broker), confirm_timeout=confirm_timeout)
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.max_retry_delay = max_retry_delay
        self.stats = RelayStats()
        self._stats_interval = stats_interval
        self._stopping = threading.Event()
        self._wakeup = Wakeup(self.engine, self._rows.table, self._stopping, listen=listen)
        self._failures = 0
        self._database_errors = (DBAPIError, self.engine.dialect.loaded_dbapi.Error)

    @property
    def table(self) -> Table:
        """The outbox table this relay sends from."""
        return self._rows.table

    @property
    def connection(self) -> Connection:
        """The relay's broker connection (a new one after each reconnection)."""
        return self._publisher.connection

    def stop(self) -> None:
        """Stop cleanly: the batch in flight is published, confirmed and deleted; the
        rest stays for the next run. Safe from another thread or a signal handler."""
        self._stopping.set()

    def prepare(self, max_retries: int | None = 3) -> None:
        """Check the outbox table is there (:func:`inbox.core._startup.wait_for_schema`) and
        connect to the broker, each retried up to ``max_retries`` times: call this before
        :meth:`run` to fail fast on a bad configuration. Raises what failed."""
        wait_for_schema(self.engine, [self._rows.table], retries=max_retries or 0)
        with contextlib.suppress(_Stopped):  # told to stop meanwhile: run() returns at once
            self._publisher.connect(self._stop_check, max_retries=max_retries)

    def run(self) -> None:
        """Send rows until :meth:`stop`, reconnecting to the broker and the database for
        ever; logs its counters when it stops."""
        logger.info(
            "relaying %s (batch size %d, poll interval %g s)",
            self._table_name(),
            self.batch_size,
            self.poll_interval,
        )
        last_stats = time.monotonic()
        self._wakeup.open()
        try:
            while not self._stopping.is_set():
                taken = self._step(strict=False)
                if taken is not None and taken < self.batch_size:
                    self._wakeup.wait(self.poll_interval)
                now = time.monotonic()
                interval = self._stats_interval
                if interval is not None and now - last_stats >= interval:
                    last_stats = now
                    logger.info("relay stats: %s", self.stats.summary())
        except _Stopped:
            pass
        finally:
            logger.info("relay stopped: %s", self.stats.summary())

    def drain(self) -> int:
        """Send every row due now, then return how many were published. Raises a database
        error that retrying would not cure (a missing table, a refused login)."""
        before = self.stats.published
        try:
            while not self._stopping.is_set():
                if self._step(strict=True) == 0:
                    break
        except _Stopped:
            pass
        return self.stats.published - before

    def run_until_empty(self, timeout: float | None = None) -> int:
        """Send rows, waiting for refused ones to come due again, until the table is empty;
        how many were published. Raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        before = self.stats.published
        self._wakeup.open()
        while not self._stopping.is_set():
            self.drain()
            if outbox_status(self.engine, self._rows.table).pending == 0:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the outbox was not empty after {timeout:g} s")
            self._wakeup.wait(min(self.poll_interval, 0.5))
        return self.stats.published - before

    def close(self) -> None:
        """Close the broker connection and the listening connection (and the engine, when
        the relay made it)."""
        self._wakeup.close()
        self._publisher.close()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- one batch ---------------------------------------------------------------------

    def _step(self, *, strict: bool) -> int | None:
        """One batch, recovering from what can be recovered from: the rows taken, or None
        after a failure (already waited for)."""
        try:
            self._publisher.connect(self._stop_check)
            self._publisher.check_alive()
            taken = self._cycle()
        except self._publisher.connection_errors as exc:
            self.stats.broker_reconnects += 1
            logger.warning("broker connection lost (%s); reconnecting", error_line(exc))
            self._publisher.drop()
            self._pause()
            return None
        except self._database_errors as exc:
            # A driver error SQLAlchemy did not wrap comes from a connection that broke
            # where SQLAlchemy does not expect it: as transient as a lost connection.
            wrapped = isinstance(exc, DBAPIError)
            transient = is_transient(exc) or not wrapped
            self.stats.database_errors += 1
            if strict and not transient:
                raise
            level = logging.INFO if transient else logging.WARNING
            logger.log(level, "database error (%s); trying again", error_line(exc))
            self._pause(quick=transient and wrapped and not exc.connection_invalidated)
            return None
        self._failures = 0
        return taken

    def _cycle(self) -> int:
        now = dt.datetime.now(dt.UTC)
        taken, sent = Taken(), Sent()
        with self.engine.connect() as connection:
            try:
                with connection.begin():
                    taken = self._rows.take(connection, self.batch_size, now)
                    if not len(taken):
                        return 0
                    sent = self._publisher.publish(taken.rows, taken.header_sizes)
                    self._record_answers(connection, taken, sent, now)
            except DBAPIError:
                if sent.confirmed:
                    self._delete_again(taken, sent, now)
                raise
        self._count(taken, sent)
        if sent.lost is not None:
            raise BrokerLost(error_line(sent.lost)) from sent.lost
        return len(taken)

    def _record_answers(
        self, connection: DatabaseConnection, taken: Taken, sent: Sent, now: dt.datetime
    ) -> None:
        """Delete the confirmed rows, record the refused ones (the seam between the publish
        and the delete: a crash here sends the batch again)."""
        self._rows.delete(connection, sent.confirmed)
        self._rows.refuse(connection, self._refusals(taken, sent, now))

    def _refusals(self, taken: Taken, sent: Sent, now: dt.datetime) -> list[Refusal]:
        return taken.refusals(sent.refused, now, self.max_retry_delay)

    def _delete_again(self, taken: Taken, sent: Sent, now: dt.datetime) -> None:
        """The broker confirmed rows whose delete failed: delete them in a new transaction.
        Rows another relay took meanwhile (or that remain) are sent again: counted."""
        for attempt in range(_DELETE_RETRIES):
            try:
                with self.engine.connect() as connection, connection.begin():
                    deleted = self._rows.delete(connection, sent.confirmed)
                    self._rows.refuse(connection, self._refusals(taken, sent, now))
            except DBAPIError as exc:
                logger.info("delete after confirm failed (%s); again", error_line(exc))
                time.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            self.stats.resent += len(sent.confirmed) - deleted
            self.stats.published += deleted
            sent.confirmed.clear()
            return
        self.stats.resent += len(sent.confirmed)
        logger.warning(
            "%d rows confirmed by the broker could not be deleted; they will be sent again",
            len(sent.confirmed),
        )
        sent.confirmed.clear()

    def _count(self, taken: Taken, sent: Sent) -> None:
        self.stats.batches += 1
        self.stats.published += len(sent.confirmed)
        self.stats.unconfirmed += len(sent.unconfirmed) + sent.repeated
        refused = len(taken.unreadable) + len(sent.refused)
        self.stats.refused += refused
        record_outbox(sent=len(sent.confirmed), refused=refused)
        if refused:
            first = next(iter({**taken.unreadable, **sent.refused}.items()))
            logger.warning(
                "%d of %d rows refused and kept for a later attempt (first: %s: %s)",
                refused,
                len(taken),
                first[0],
                first[1],
            )

    # --- waiting and stopping ------------------------------------------------------------

    def _pause(self, *, quick: bool = False) -> None:
        self._failures += 1
        base = 0.01 if quick else 0.5
        delay = min(base * 2 ** min(self._failures - 1, 10), 30.0)
        self._stopping.wait(delay)

    def _stop_check(self) -> None:
        if self._stopping.is_set():
            raise _Stopped

    def _table_name(self) -> str:
        table = self._rows.table
        return f"{table.schema}.{table.name}" if table.schema else table.name
