"""S7's helpers (``s7_batch_handler.py`` runs them). The database-side figures:
``inbox.process_batch`` with no broker, what the batch path costs at the database, beside
pgbench in the same rounds:

* ``process_batch``, batch handler (one executemany): messages built in memory, batches of
  ``--batch-size``, the same one-row batch handler as the worker's (``all_rows``);
* the same with a batch handler that sends its rows as two arrays, one ``INSERT … SELECT
  unnest(:refs), unnest(:amounts)`` (``all_rows_unnest``): what the handler's own statement
  costs when it is one statement on the server too.

:func:`statements_per_batch` records, with a ``before_cursor_execute`` listener, what one
batch sends to the driver: each cursor call, whether it is an executemany and how many
parameter sets it carries; :func:`wire_round_trips` counts one batch's round trips on the
wire (``inbox.testing.round_trips.RoundTripCounter``) at two batch sizes. :func:`profile`
runs cProfile over one run.

The broker side: :class:`Span` times a worker's inbox calls, :func:`fill` fills a queue,
:func:`run_broker_only` is the kombu consumer that only acks (the broker edge's ceiling).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
import uuid
from collections.abc import Callable
from typing import Any

from kombu import Connection, Consumer, Producer, Queue
from s1_overhead import INSERT_ORDER, orders
from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, ProcessResult
from inbox.message import uuid7
from inbox.testing.round_trips import RoundTripCounter

PB_EXECUTEMANY = "process_batch, batch handler (no broker)"
PB_UNNEST = "process_batch, unnest handler (no broker)"
HANDLER = "bench.orders"

INSERT_ORDERS_UNNEST = insert(orders).from_select(
    ["ref", "amount"],
    select(
        func.unnest(bindparam("refs", type_=postgresql.ARRAY(BigInteger))),
        func.unnest(bindparam("amounts", type_=postgresql.ARRAY(Integer))),
    ),
)


def all_rows(messages: list[Message], session: Session) -> None:
    """The batch handler: the batch's rows in one executemany (S7's worker runs it too)."""
    session.execute(INSERT_ORDER, [{"ref": m.body["ref"], "amount": 7} for m in messages])


def all_rows_unnest(messages: list[Message], session: Session) -> None:
    """The batch handler with the rows as two arrays: one statement, two parameters."""
    refs = [m.body["ref"] for m in messages]
    session.execute(INSERT_ORDERS_UNNEST, {"refs": refs, "amounts": [7] * len(refs)})


def batch_inbox(engine: Engine, variant: str) -> Inbox:
    """An inbox whose one batch handler is ``variant``'s."""
    inbox = Inbox(sessionmaker(engine))
    handler = all_rows if variant == PB_EXECUTEMANY else all_rows_unnest
    inbox.batch_handler("order.created", name=HANDLER)(handler)
    return inbox


def batches(messages: int, size: int, first_ref: int) -> list[list[Message]]:
    """``messages`` new order messages in batches of ``size``."""
    made = [Message.new("order.created", {"ref": first_ref + i}) for i in range(messages)]
    return [made[i : i + size] for i in range(0, messages, size)]


def run_process_batch(
    engine: Engine, variant: str, messages: int, size: int, first_ref: int
) -> dict[str, Any]:
    """``process_batch`` over ``messages`` in-memory messages: the rate (messages / the time
    of the ``process_batch`` calls; building the messages is not timed)."""
    inbox = batch_inbox(engine, variant)
    work = batches(messages, size, first_ref)
    results: list[Any] = []
    clock = time.perf_counter
    started = clock()
    for batch in work:
        results += inbox.process_batch(batch)
    elapsed = clock() - started
    processed = sum(isinstance(r, ProcessResult) and HANDLER in r.processed for r in results)
    if processed != messages:
        raise SystemExit(f"{variant}: processed {processed} of {messages}")
    return {"rate": messages / elapsed, "messages": messages}


def statements_per_batch(engine: Engine, variant: str, size: int, first_ref: int) -> list[str]:
    """What one batch of ``size`` sends to the driver, one line per cursor call."""
    inbox = batch_inbox(engine, variant)
    (batch,) = batches(size, size, first_ref)
    sent: list[str] = []

    def record(
        _conn: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, many: bool
    ) -> None:
        words = " ".join(statement.split()[:3])
        values = statement.count("), (") + 1 if " VALUES " in statement else 0
        call = f"executemany of {len(params)} parameter sets" if many else "execute"
        sent.append(f"{words} …: {call}" + (f", {values} VALUES rows" if values > 1 else ""))

    event.listen(engine, "before_cursor_execute", record)
    try:
        inbox.process_batch(batch)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return sent


def wire_round_trips(engine: Engine, variant: str, sizes: tuple[int, ...]) -> dict[int, int]:
    """Round trips on the wire of one ``process_batch`` per batch size (after a warm-up batch
    of that size), through a counting proxy in front of ``engine``'s server."""
    url = engine.url
    counts: dict[int, int] = {}
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 5432) as counter:
        counted = create_engine(counter.url(url), pool_size=1, max_overflow=0)
        try:
            inbox = batch_inbox(counted, variant)
            for number, size in enumerate(sizes):
                warm, measured = batches(2 * size, size, 10**14 + number * 10**6)
                inbox.process_batch(warm)
                counter.reset()
                inbox.process_batch(measured)
                counts[size] = counter.count
        finally:
            counted.dispose()
    return counts


def profile(run: Callable[[], object], top: int = 30) -> str:
    """cProfile over ``run()``: the ``top`` functions by cumulative and by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


class Span:
    """Start of the first and end of the last inbox call a worker made: wraps the inbox's
    ``process`` and ``process_batch`` on the instance, as the worker calls them."""

    def __init__(self, inbox: Inbox) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.calls = 0
        for name in ("process", "process_batch"):
            setattr(inbox, name, self._timed(getattr(inbox, name)))

    def _timed(self, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed(argument: Any) -> Any:
            if self.first is None:
                self.first = time.perf_counter()
            self.calls += 1
            try:
                return call(argument)
            finally:
                self.last = time.perf_counter()

        return timed

    def rate(self, messages: int) -> float:
        assert self.first is not None, "the worker processed nothing"
        return messages / (self.last - self.first)


def fill(broker: str, queue: str, messages: int, first_ref: int) -> None:
    """Publish ``messages`` order messages to ``queue`` (persistent, UUIDv7 ids, not
    confirmed one by one: this is set-up, not measured), then wait until all are queued."""
    with Connection(broker) as connection:
        producer = Producer(connection.channel())
        for ref in range(first_ref, first_ref + messages):
            producer.publish(
                {"ref": ref},
                routing_key=queue,
                serializer="json",
                message_id=str(uuid7()),
                type="order.created",
                delivery_mode=2,
            )
        channel = connection.channel()
        deadline = time.monotonic() + 60
        while channel.queue_declare(queue=queue, passive=True).message_count < messages:
            if time.monotonic() > deadline:
                raise SystemExit(f"{queue}: the broker did not queue {messages} messages")
            time.sleep(0.05)


def run_broker_only(options: argparse.Namespace, messages: int, first_ref: int) -> dict[str, Any]:
    """A kombu consumer that only acks (``multiple=True`` every batch): its rate."""
    queue = Queue(f"bench-s7-{uuid.uuid4().hex[:8]}", durable=True, auto_delete=False)
    with Connection(options.broker) as connection:
        channel = connection.channel()
        queue(channel).declare()
        seen: list[Any] = []
        times: list[float] = []

        def on_message(_body: Any, delivery: Any) -> None:
            if not times:
                times.append(time.perf_counter())
            seen.append(delivery)
            if len(seen) % options.batch_size == 0 or len(seen) == messages:
                delivery.ack(multiple=True)
                times[1:] = [time.perf_counter()]

        try:
            fill(options.broker, queue.name, messages, first_ref)
            prefetch = max(options.prefetch, options.batch_size)
            with Consumer(channel, [queue], callbacks=[on_message], prefetch_count=prefetch):
                while len(seen) < messages:
                    connection.drain_events(timeout=10)
        finally:
            queue(channel).delete()
    return {"rate": messages / (times[-1] - times[0]), "messages": messages}
