"""What one delivery costs the RabbitMQ worker, as counts: Python calls and ``basic.ack``
frames per delivery, beside a plain kombu consumer whose callback runs the same one-row
transaction and acks (benchmarks/s2_end_to_end.py's plain consumer, with the row of
tests/support/costs.py).

Run in a process of its own (``python tests/support/worker_costs.py POSTGRES_URL AMQP_URL
QUEUE_PREFIX``, one JSON object out), as costs.py is. Each variant consumes
:data:`DELIVERIES` messages published beforehand (so every delivery is at hand, prefetch
100), counted from the first ``drain_events`` to the last ack; the count is the minimum
over :data:`RUNS` runs. The worker's run is the whole of ``Worker.run`` (connecting,
declaring, consuming, and the clean stop the last handler call asks for): a few hundred
calls once, spread over the deliveries.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import amqp
from kombu import Connection, Consumer, Queue
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.broker import Publisher, Worker
from inbox.schema import metadata as inbox_metadata
from support.costs import business, write

DELIVERIES = 200
PREFETCH = 100
RUNS = 3
WARM_UP = 20
_BASIC_ACK = amqp.Channel.basic_ack.__code__


class Counted:
    """Python calls (Python and C) and ``basic.ack`` calls while :meth:`start` is on."""

    def __init__(self) -> None:
        self.calls = 0
        self.acks = 0

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            if frame.f_code is _BASIC_ACK:
                self.acks += 1
        elif event == "c_call":
            self.calls += 1

    def start(self) -> None:
        self.calls = self.acks = 0
        gc.disable()
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(None)
        gc.enable()
        self.calls -= 1  # the setprofile(None) call itself


def fill(url: str, queue: str, count: int) -> None:
    with Publisher(url, routing_key=queue) as publisher:
        for ref in range(count):
            publisher.publish("order.created", {"ref": f"r{ref}"})


def plain_run(sessions: sessionmaker[Session], url: str, queue: str, count: int) -> Counted:
    counted = Counted()
    done = [0]

    def on_message(body: Any, delivery: Any) -> None:
        message = Message(delivery.properties["message_id"], "order.created", body)
        with sessions() as session, session.begin():
            write(message, session)
        delivery.ack()
        done[0] += 1

    declared = Queue(queue, durable=True, auto_delete=False)
    with Connection(url) as connection:
        channel = connection.channel()
        declared(channel).declare()
        fill(url, queue, count)
        with Consumer(
            channel, [declared], callbacks=[on_message], prefetch_count=PREFETCH, accept=["json"]
        ):
            counted.start()
            while done[0] < count:
                connection.drain_events(timeout=10)
            counted.stop()
        declared(channel).delete()
    return counted


def worker_run(
    sessions: sessionmaker[Session], url: str, queue: str, count: int, batch_size: int = 1
) -> Counted:
    counted = Counted()
    inbox = Inbox(sessions)
    worker = Worker(
        inbox, url, [queue], prefetch=PREFETCH, batch_size=batch_size, stats_interval=None
    )
    done = [0]

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        write(message, session)
        done[0] += 1
        if done[0] == count:
            worker.stop()  # the last one: its ack, and any held, go out at the stop

    worker.prepare()
    fill(url, queue, count)
    counted.start()
    worker.run()
    counted.stop()
    assert worker.stats.processed == worker.stats.acked == count, worker.stats.summary()
    with Connection(url) as connection, connection.channel() as channel:
        for topology in worker.topologies:
            for declared in topology.queues():
                channel.queue_delete(declared.name)
    return counted


def per_delivery(
    run: Callable[[sessionmaker[Session], str, str, int], Counted],
    sessions: sessionmaker[Session],
    url: str,
    prefix: str,
) -> dict[str, float]:
    run(sessions, url, f"{prefix}.warm", WARM_UP)
    seen = [run(sessions, url, f"{prefix}.{n}", DELIVERIES) for n in range(RUNS)]
    best = min(seen, key=lambda counted: counted.calls)
    return {"calls": best.calls / DELIVERIES, "acks": best.acks / DELIVERIES}


def measure(postgres_url: str, amqp_url: str, prefix: str) -> dict[str, Any]:
    """``{"worker/first": {"plain": {...}, "inbox": {...}}, "worker/batch": ...}``, per
    delivery; "worker/batch" is the worker with ``batch_size`` = the prefetch (100)."""
    engine = create_engine(postgres_url)
    business.create_all(engine)
    inbox_metadata.create_all(engine)
    sessions = sessionmaker(engine)
    plain = per_delivery(plain_run, sessions, amqp_url, f"{prefix}.plain")
    inbox = per_delivery(worker_run, sessions, amqp_url, f"{prefix}.inbox")
    batch = per_delivery(
        partial(worker_run, batch_size=PREFETCH), sessions, amqp_url, f"{prefix}.batch"
    )
    engine.dispose()
    return {
        "worker/first": {"plain": plain, "inbox": inbox},
        "worker/batch": {"plain": plain, "inbox": batch},
    }


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2], sys.argv[3]), sort_keys=True))
