"""A multi-tenant consumer: one inbox, one queue, a database per tenant. Each delivery is
claimed and applied in its own tenant's database, chosen from the message's ``tenant``
header. SQLite files and kombu's in-memory broker by default, so it runs with no servers:

    python examples/tenants.py [--broker amqp://...]

1. ``Inbox(sessions_for=...)`` takes the session factory as a function of the message: here
   a ``sessionmaker`` per tenant database (for schema-per-tenant, the same function returns
   sessions of ``engine.execution_options(schema_translate_map={None: tenant})``).
2. Two tenants receive orders; one message id reaches both tenants (ids are unique per
   producer, not across tenants' producers): each tenant applies it once, in its own
   database. A copy of an order delivered twice is a duplicate in its tenant only.
3. A message for a tenant nobody knows fails on every try (``sessions_for`` raises) and is
   dead-lettered: it never touches another tenant's tables.
4. ``inbox-cleanup`` runs over every tenant database at once (several ``--database-url``;
   ``--schema a --schema b`` or ``--all-schemas`` for schemas on PostgreSQL).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from kombu import Connection
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
)
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_message
from inbox.schema import metadata as inbox_metadata

shop = MetaData()
orders = Table(
    "example_tenant_order",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_ref", String(40), nullable=False),
)
TENANTS = ("acme", "globex")


class UnknownTenant(LookupError):
    """A message names a tenant this service does not serve."""


def tenant_inbox(engines: dict[str, Engine]) -> Inbox:
    """The consumer: each delivery's session comes from its tenant's database."""
    sessions = {tenant: sessionmaker(engine) for tenant, engine in engines.items()}

    def sessions_for(message: Message) -> Session:
        tenant = message.headers.get("tenant")
        if tenant not in sessions:
            raise UnknownTenant(f"message {message.id} names unknown tenant {tenant!r}")
        return sessions[tenant]()

    inbox = Inbox(sessions_for=sessions_for)

    @inbox.handler("order.placed", name="orders.record")
    def record(message: Message, session: Session) -> None:
        session.execute(insert(orders).values(order_ref=message.body["ref"]))

    return inbox


def consume(worker: Worker, processed: int, dead: int, timeout: float = 60.0) -> None:
    """Run ``worker`` until ``processed`` handler runs committed and ``dead`` deliveries
    were dead-lettered; then stop it."""
    worker.prepare()
    thread = threading.Thread(target=worker.run, name="worker")
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and (
            worker.stats.processed < processed or worker.stats.dead_lettered < dead
        ):
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(timeout)


def tenant_rows(engine: Engine) -> tuple[list[str], int]:
    """A tenant's order refs and its number of claims."""
    with engine.connect() as connection:
        refs = sorted(connection.execute(select(orders.c.order_ref)).scalars())
        claims = len(connection.execute(select(inbox_message.c.message_id)).all())
    return refs, claims


def run(scratch: Path, broker: str, prefix: str = "example") -> int:
    """The whole scenario; 0 when every tenant holds exactly its own orders and claims."""
    queue = f"{prefix}.tenant-orders"
    urls = {tenant: f"sqlite:///{scratch / f'{tenant}.db'}" for tenant in TENANTS}
    engines = {tenant: create_engine(url) for tenant, url in urls.items()}
    for engine in engines.values():
        inbox_metadata.create_all(engine)
        shop.create_all(engine)
    worker = Worker(
        tenant_inbox(engines),
        broker,
        [queue],
        retry=RetryPolicy(delays=(0.05,), max_tries=2),
        stats_interval=None,
    )
    try:
        worker.prepare()
        shared = uuid.uuid4()  # one id, two tenants' producers
        with Publisher(broker) as publisher:
            for tenant, refs in (("acme", ["a-1", "a-2"]), ("globex", ["g-1"])):
                for ref in refs:
                    publisher.publish(
                        "order.placed", {"ref": ref}, routing_key=queue, headers={"tenant": tenant}
                    )
                publisher.publish(
                    "order.placed",
                    {"ref": f"{tenant}-shared"},
                    routing_key=queue,
                    headers={"tenant": tenant},
                    message_id=shared,
                )
            publisher.publish(  # acme's shared order again: a duplicate for acme only
                "order.placed",
                {"ref": "acme-shared"},
                routing_key=queue,
                headers={"tenant": "acme"},
                message_id=shared,
            )
            publisher.publish(
                "order.placed", {"ref": "x-1"}, routing_key=queue, headers={"tenant": "initech"}
            )
        consume(worker, processed=5, dead=1)
        print(f"consumer: {worker.stats.summary()}")
        seen = {tenant: tenant_rows(engine) for tenant, engine in engines.items()}
        for tenant, (refs, claims) in seen.items():
            print(f"tenant {tenant}: orders {refs}, {claims} claims")
        cleanup_args = ["--days", "30", "--dry-run"]
        for url in urls.values():
            cleanup_args += ["--database-url", url]
        print("inbox-cleanup " + " ".join(cleanup_args).replace(str(scratch), "<tmp>"))
        cleaned = cleanup_main(cleanup_args)
        ok = cleaned == 0 and seen == {
            "acme": (["a-1", "a-2", "acme-shared"], 3),
            "globex": (["g-1", "globex-shared"], 2),
        }
        ok = ok and worker.stats.duplicates == 1 and worker.stats.dead_lettered == 1
        print("every tenant holds exactly its own orders" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        with Connection(broker) as connection, connection.channel() as channel:
            for topology in worker.topologies:
                for declared in topology.queues():
                    channel.queue_delete(queue=declared.name)
        worker.connection.release()
        for engine in engines.values():
            engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; exit 0 when no tenant saw another tenant's orders."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default="memory://", help="default: memory:// (in-process)")
    parser.add_argument("--prefix", default="example", help="queue name prefix")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        return run(Path(scratch), options.broker, options.prefix)


if __name__ == "__main__":
    sys.exit(main())
