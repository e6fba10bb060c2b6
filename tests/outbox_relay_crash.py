"""Run by tests/test_outbox_relay_faults.py: a relay that SIGKILLs itself at the one point
where a crash sends rows twice, after the broker confirmed a batch and before its delete.

Usage: ``python outbox_relay_crash.py DATABASE_URL BROKER_URL BATCH_SIZE``. The hook is this
subclass, not the library: the relay's ``_record_answers`` is the seam between publish and delete.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys

from sqlalchemy import Connection

from inbox.broker import Relay
from inbox.outbox.relay._publish import Sent
from inbox.outbox.relay._rows import Taken


class CrashingRelay(Relay):
    """Dies, unannounced, once the broker has confirmed a batch, before deleting it."""

    def _record_answers(
        self, connection: Connection, taken: Taken, sent: Sent, now: dt.datetime
    ) -> None:
        if sent.confirmed:
            os.kill(os.getpid(), signal.SIGKILL)
        super()._record_answers(connection, taken, sent, now)


if __name__ == "__main__":
    database, broker, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    CrashingRelay(database, broker, batch_size=batch_size, stats_interval=None).drain()
    sys.exit("the relay drained without crashing: the batch was never confirmed")
