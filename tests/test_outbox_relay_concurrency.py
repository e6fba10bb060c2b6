"""Several relays at once over one outbox table on PostgreSQL and MariaDB, while a writer
keeps committing rows: every row is published at least once, none is left, every copy
beyond the first is one the relays counted, and each relay sends the rows it took in id
order (one writer commits in id order)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import Counter

import pytest
from sqlalchemy import Connection
from support.databases import Database
from support.rabbit import Rabbit
from support.relay import add_rows, declare_queue, op_row, outbox_ids, receive_all
from support.worker import wait_until

from inbox.broker import Relay
from inbox.outbox.relay._publish import Sent
from inbox.outbox.relay._rows import Taken

ROWS = 10_000
WRITE_BATCH = 50


class RecordingRelay(Relay):
    """A relay that remembers the ids the broker confirmed to it, in confirm order."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.confirmed: list[uuid.UUID] = []

    def _record_answers(
        self, connection: Connection, taken: Taken, sent: Sent, now: dt.datetime
    ) -> None:
        super()._record_answers(connection, taken, sent, now)
        self.confirmed.extend(sent.confirmed)


@pytest.mark.slow
@pytest.mark.parametrize("relays", [2, 4])
def test_concurrent_relays_publish_every_row_and_leave_none(
    server_db: Database, rabbit: Rabbit, relays: int
) -> None:
    queue = declare_queue(rabbit, "q")
    written: list[uuid.UUID] = []
    running = [
        RecordingRelay(
            server_db.engine, rabbit.url, batch_size=100, poll_interval=0.05, stats_interval=None
        )
        for _ in range(relays)
    ]
    threads = [threading.Thread(target=relay.run, daemon=True) for relay in running]
    for thread in threads:
        thread.start()
    try:
        for start in range(0, ROWS, WRITE_BATCH):
            rows = [op_row(queue, f"r{start + i}") for i in range(WRITE_BATCH)]
            add_rows(server_db.engine, rows)  # races the relays' deletes: InnoDB may deadlock
            written.extend(r.id for r in rows)
        wait_until(lambda: not outbox_ids(server_db.engine), "the outbox to empty", 120)
    finally:
        for relay in running:
            relay.stop()
        for thread in threads:
            thread.join(60)
        for relay in running:
            relay.close()

    sent = Counter(m.message_id for m in receive_all(rabbit, queue))
    assert set(sent) == set(written)
    extra = sum(n - 1 for n in sent.values())
    counted = sum(r.stats.resent + r.stats.unconfirmed for r in running)
    assert extra <= counted, [r.stats.summary() for r in running]
    assert sum(r.stats.published for r in running) + sum(r.stats.resent for r in running) >= ROWS
    for relay in running:
        assert relay.confirmed == sorted(relay.confirmed), relay.stats.summary()
    assert sum(1 for r in running if r.stats.published) >= 2  # they did share the work
