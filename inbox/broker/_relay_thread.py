"""A relay inside an ``inbox-worker`` process (``--relay``): on the inbox's own database and
the worker's broker, in a thread of its own, stopped by whatever stops the worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from kombu.connection import Connection

from inbox.core import Inbox
from inbox.core._startup import inbox_engine
from inbox.errors import ConfigurationError
from inbox.outbox.relay._relay import Relay

__all__ = ["RelayThread", "relay_for", "running_beside"]

logger = logging.getLogger("inbox.relay")


class _Stoppable(Protocol):
    def stop(self) -> None: ...


def relay_for(inbox: Inbox, broker: Connection, table: str) -> Relay:
    """A relay of the outbox ``table`` in the database ``inbox``'s sessions use, sending to
    ``broker``; ValueError when those sessions are not bound to an engine."""
    engine = inbox_engine(inbox._session_factory, inbox.table.insert())
    if engine is None:
        raise ConfigurationError(
            "--relay needs the inbox's session factory bound to an engine "
            "(sessionmaker(engine)): the relay sends from that database"
        )
    return Relay(engine, broker, table=table)


class RelayThread:
    """Runs ``relay`` in a daemon thread beside ``worker``; :meth:`stop` stops both (it is
    what the signal handlers call). A relay that fails stops the worker too."""

    def __init__(self, relay: Relay, worker: _Stoppable) -> None:
        self.relay = relay
        self._worker = worker
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inbox-relay", daemon=True)

    def start(self) -> None:
        """Start the relay."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker and the relay (each finishes what it has in flight)."""
        self._worker.stop()
        self.relay.stop()

    def join(self, timeout: float | None = None) -> None:
        """Stop the relay and wait for it (it finishes its batch in flight); raise what
        made it fail, if something did."""
        self.relay.stop()
        self._thread.join(timeout)
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Stop the relay, wait for it, and close its connections."""
        self.relay.stop()
        if self._thread.is_alive():
            self._thread.join()
        self.relay.close()

    def _run(self) -> None:
        try:
            self.relay.run()
        except BaseException as exc:
            logger.exception("the relay failed; stopping the worker")
            self.failure = exc
            self._worker.stop()


@contextmanager
def running_beside(relay: RelayThread | None, connect_retries: int) -> Iterator[None]:
    """Prepare and start ``relay`` (if any) for the block that runs its worker; after the
    block, stop it, wait for it, close it, and raise what made it fail."""
    if relay is None:
        yield
        return
    relay.relay.prepare(max_retries=connect_retries)
    relay.start()
    try:
        yield
        relay.join()
    finally:
        relay.close()
