"""How an idle relay waits: woken by PostgreSQL ``NOTIFY`` when a publishing transaction
commits, else (MySQL/MariaDB, SQLite, a driver other than psycopg 3, the listening connection
lost) by the poll interval running out.

The outbox table's trigger notifies :data:`inbox.schema.OUTBOX_NOTIFY_CHANNEL` with
``schema.table``; the relay listens on a connection of its own, in autocommit, taken out of
the engine's pool (so it has the engine's connect arguments) and never returned to it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Final

from sqlalchemy import Engine, Table

from inbox._backends import family_of
from inbox.outbox.relay._refusals import error_line

__all__ = ["Wakeup"]

_LISTEN: Final = "LISTEN inbox_outbox"  # inbox.schema.OUTBOX_NOTIFY_CHANNEL, as a literal
logger = logging.getLogger("inbox.relay")

_SLICE: Final = 0.25  # how often a waiting relay looks at its stop flag
_RELISTEN_AFTER: Final = 5.0  # seconds between attempts to listen again after a loss


class Wakeup:
    """Waits until rows may be due: a notification for ``table``, a stop, or the timeout."""

    def __init__(self, engine: Engine, table: Table, stopping: threading.Event, *, listen: bool):
        self._engine = engine
        self._table = table
        self._stopping = stopping
        self._wanted = listen and family_of(engine).notifies
        self._connection: Any = None
        self._payload: str | None = None
        self._next_try = 0.0

    def open(self) -> None:
        """Start listening, before the first look at the table: a row committed after that
        look is then always notified."""
        if self._wanted and self._connection is None:
            self._listen()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when woken by a notification, or when
        listening again after a loss (rows committed meanwhile were not notified)."""
        deadline = time.monotonic() + timeout
        if self._wanted and self._connection is None and time.monotonic() >= self._next_try:
            self._listen()
            if self._connection is not None:
                return True
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._connection is None:
                self._stopping.wait(remaining)
                return False
            try:
                # One at a time: the generator holds the connection until it is finished.
                got = list(self._connection.notifies(timeout=min(remaining, _SLICE), stop_after=1))
                if any(notify.payload == self._payload for notify in got):
                    self._discard_pending()
                    return True
            except Exception as exc:  # the server went away: poll until it is back
                logger.warning("outbox LISTEN connection lost (%s); polling", error_line(exc))
                self.close()
                self._next_try = time.monotonic() + _RELISTEN_AFTER
        return False

    def close(self) -> None:
        """Close the listening connection."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # already gone
                connection.close()

    def _listen(self) -> None:
        try:
            raw = self._engine.raw_connection()
            driver: Any = raw.driver_connection
            raw.detach()  # never back to the pool: it holds a LISTEN
            if type(driver).__module__.split(".")[0] != "psycopg":
                raw.close()
                self._wanted = False
                logger.info("outbox NOTIFY needs the psycopg driver; polling instead")
                return
            driver.rollback()
            driver.autocommit = True
            schema = self._table.schema
            if schema is None:
                schema = driver.execute("SELECT current_schema()").fetchone()[0]
            driver.execute(_LISTEN)
        except Exception as exc:
            logger.warning("cannot LISTEN for outbox rows (%s); polling", error_line(exc))
            self._next_try = time.monotonic() + _RELISTEN_AFTER
            return
        self._payload = f"{schema}.{self._table.name}"
        self._connection = driver

    def _discard_pending(self) -> None:
        """Swallow notifications already received: one wake-up takes every committed row."""
        try:
            for _ in self._connection.notifies(timeout=0.001):  # 0 would mean no timeout
                pass
        except Exception:
            self.close()
