"""The SMS demo: a handler that calls an SMS provider and then fails, redeliveries, re-sends,
two crashed processes, and a ledger that proves every SMS went out once.

    python examples/demo_sms.py [--requests N]

(or ``python -m inbox.demo_sms`` from a checkout). Everything is local: the inbox in one
SQLite file, its effect records in a second one (SQLite lets one transaction write at a
time, and the claim's holds that lock), kombu's in-memory broker, and a fake SMS provider
that appends each request's idempotency key to a file and, like real providers, sends one
SMS per key.

The handler ``sms.send`` sends the SMS inside ``inbox.effect`` and then records the delivery
in ``demo_sms_log``; for every 5th request it then fails once ("publishing the follow-up
timed out"), so the worker retries it. Some messages are redelivered with the same id, some
re-sent with a fresh id and the same ``idempotency-key``. Before the worker starts, two
child processes each take one request and die: one inside the call, after the provider
accepted the SMS (the record says started: the retry calls again with the SAME key, and the
provider sends nothing new), one after the effect was recorded done but before the handler
committed (the retry gets the stored receipt without calling). The demo exits 1 unless every
request has exactly one SMS and one delivery row.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker._idle import delete_queues, run_until_idle
from inbox.core import Inbox
from inbox.message import IDEMPOTENCY_KEY_HEADER, Message
from inbox.schema import metadata as inbox_metadata

__all__ = ["FakeSmsProvider", "SmsLedger", "main", "run_demo"]

business = MetaData()
sms_log = Table(
    "demo_sms_log",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Deliberately not unique: a doubled delivery row must show up in the ledger.
    Column("request", Integer, nullable=False, index=True),
    Column("provider_id", String(64), nullable=False),
)
CRASH_POINTS = ("in-call", "after-done")
RETRY = RetryPolicy((0.05, 0.1), max_tries=4)


class FakeSmsProvider:
    """Appends each request's idempotency key to a file (so a crashed process's request is
    counted too); one SMS goes out per distinct key, as a real provider deduplicates."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def send(self, phone: str, text: str, idempotency_key: uuid.UUID) -> dict[str, str]:
        with self.path.open("a") as log:
            log.write(f"{idempotency_key}\n")
        return {"id": f"sms-{idempotency_key.hex[:12]}", "to": phone}

    def requests_per_key(self) -> Counter[str]:
        """Requests received per idempotency key."""
        return Counter(self.path.read_text().split()) if self.path.exists() else Counter()


@dataclass
class SmsLedger:
    """What the demo delivered, what the provider received and what the database holds."""

    requests: int = 0
    deliveries: int = 0
    redelivered_same_id: int = 0
    resent_fresh_id: int = 0
    failures_retried: int = 0
    crashed_processes: int = 0
    dead_lettered: int = 0
    provider_requests: int = 0
    repeated_with_same_key: int = 0
    sms_sent: int = 0
    delivery_rows: int = 0
    requests_with_one_row: int = 0

    @property
    def exact(self) -> bool:
        """Every request: one SMS (one key) and one delivery row; nothing dead-lettered."""
        return (
            self.dead_lettered == 0
            and self.sms_sent == self.requests
            and self.delivery_rows == self.requests
            and self.requests_with_one_row == self.requests
        )


def build_inbox(
    database: str, store: str, provider: FakeSmsProvider, crash: str | None = None
) -> Inbox:
    """The demo's inbox on ``database`` with its effect records in ``store``; ``crash`` makes
    the process die at that point (the crash children only)."""
    effect_store = create_engine(store)
    inbox = Inbox(sessionmaker(create_engine(database)), effect_store=effect_store)
    failed_once: set[int] = set()

    def send(key: uuid.UUID, body: dict[str, Any]) -> dict[str, str]:
        receipt = provider.send(body["phone"], body["text"], key)
        if crash == "in-call":
            os._exit(70)  # the provider has the SMS; the process dies before it hears back
        return receipt

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        body = message.body
        receipt = inbox.effect("provider.send", lambda key: send(key, body))
        if crash == "after-done":
            os._exit(70)  # the receipt is recorded; the delivery row is not committed
        session.execute(insert(sms_log).values(request=body["request"], provider_id=receipt["id"]))
        if body["request"] % 5 == 0 and body["request"] not in failed_once:
            failed_once.add(body["request"])
            raise TimeoutError("publishing the follow-up message timed out")

    return inbox


def request_stream(requests: int, rng: random.Random) -> tuple[list[Message], int, int]:
    """One message per request, plus redeliveries (same id) and re-sends (fresh id)."""
    stream: list[Message] = []
    redelivered = resent = 0
    for request in range(1, requests + 1):
        body = {"request": request, "phone": f"+4479460{request:05}", "text": "Your code: 1234"}
        headers = {IDEMPOTENCY_KEY_HEADER: f"sms-request-{request}"}
        original = Message.new("sms.requested", body, headers)
        stream.append(original)
        for _ in range(rng.choice((0, 0, 1, 2))):
            stream.append(original)
            redelivered += 1
        if rng.random() < 0.25:
            stream.append(Message.new("sms.requested", body, headers))
            resent += 1
    rng.shuffle(stream)
    return stream, redelivered, resent


def _crash_child(paths: dict[str, str], point: str, message: Message) -> None:
    """Process ``message`` in a child process that dies at ``point``."""
    payload = json.dumps(
        {"id": str(message.id), "body": message.body, "headers": dict(message.headers)}
    )
    subprocess.run(
        [sys.executable, __file__, "--crash", point, json.dumps(paths), payload],
        check=False,
        timeout=60,
    )


def run_demo(directory: Path, *, requests: int = 60, seed: int = 7) -> SmsLedger:
    """Run the scenario with its files in ``directory``; return the ledger."""
    paths = {
        "database": f"sqlite:///{directory / 'inbox.db'}",
        "store": f"sqlite:///{directory / 'effects.db'}",
        "provider": str(directory / "provider-requests.log"),
    }
    engine = create_engine(paths["database"])
    inbox_metadata.create_all(engine)
    business.create_all(engine)
    inbox_metadata.tables["inbox_effect"].create(create_engine(paths["store"]))
    provider = FakeSmsProvider(Path(paths["provider"]))
    stream, redelivered, resent = request_stream(requests, random.Random(seed))
    ledger = SmsLedger(requests, redelivered_same_id=redelivered, resent_fresh_id=resent)
    crashed = {m.body["request"]: m for m in stream if m.body["request"] in (3, 4)}
    for point, request in zip(CRASH_POINTS, (3, 4), strict=True):
        _crash_child(paths, point, crashed[request])
        ledger.crashed_processes += 1
    inbox = build_inbox(paths["database"], paths["store"], provider)
    queue = f"inbox-demo-sms-{uuid.uuid4().hex[:8]}"
    worker = Worker(inbox, "memory://", [queue], prefetch=20, retry=RETRY, stats_interval=None)
    try:
        worker.prepare()
        with Publisher("memory://", routing_key=queue) as publisher:
            for message in stream:
                publisher.publish_message(message)
        run_until_idle(worker, 1.0)
    finally:
        delete_queues(worker)
    stats = worker.stats
    ledger.deliveries, ledger.failures_retried = stats.deliveries, stats.retried
    ledger.dead_lettered = stats.dead_lettered
    per_key = provider.requests_per_key()
    ledger.provider_requests = per_key.total()
    ledger.repeated_with_same_key = sum(n - 1 for n in per_key.values())
    ledger.sms_sent = len(per_key)
    with engine.connect() as connection:
        per_request = select(sms_log.c.request, func.count().label("n")).group_by(sms_log.c.request)
        rows = connection.execute(select(per_request.subquery().c.n)).scalars().all()
    ledger.delivery_rows = sum(rows)
    ledger.requests_with_one_row = sum(1 for n in rows if n == 1)
    return ledger


def _print_ledger(ledger: SmsLedger) -> None:
    rows = [
        ("SMS requests (business operations)", ledger.requests),
        ("deliveries", ledger.deliveries),
        ("  redelivered with the same id", ledger.redelivered_same_id),
        ("  re-sent with a fresh id, same idempotency-key", ledger.resent_fresh_id),
        ("  retried after the handler failed after sending", ledger.failures_retried),
        ("processes crashed mid-request", ledger.crashed_processes),
        ("dead-lettered", ledger.dead_lettered),
        ("provider requests", ledger.provider_requests),
        ("  repeated with the same idempotency key", ledger.repeated_with_same_key),
        ("SMS sent (one per idempotency key)", ledger.sms_sent),
        ("delivery rows committed", ledger.delivery_rows),
        ("requests with exactly one delivery row", ledger.requests_with_one_row),
    ]
    print("inbox SMS demo: in-memory broker -> worker -> SQLite (effects in a second file)")
    for label, value in rows:
        print(f"  {label:<50} {value:>6}")
    print(
        "EXACTLY ONCE: every SMS sent once, every delivery row once" if ledger.exact else "MISMATCH"
    )


def _run_crash_child(point: str, paths_json: str, payload: str) -> int:
    paths = json.loads(paths_json)
    raw = json.loads(payload)
    message = Message(uuid.UUID(raw["id"]), "sms.requested", raw["body"], raw["headers"])
    inbox = build_inbox(
        paths["database"], paths["store"], FakeSmsProvider(Path(paths["provider"])), point
    )
    inbox.process(message)
    return 1  # not reached: the process dies inside


def main(argv: Sequence[str] | None = None) -> int:
    """Run the SMS demo; exit 0 when the ledger is exact, else 1."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="examples/demo_sms.py", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=60, help="SMS requests to send")
    parser.add_argument("--seed", type=int, default=7, help="seed for the delivery shuffle")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the inbox's log")
    parser.add_argument("--crash", choices=CRASH_POINTS, help=argparse.SUPPRESS)
    parser.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crash is not None:
        return _run_crash_child(args.crash, *args.child)
    if args.requests < 5:
        parser.error("--requests must be at least 5")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL,
        format="%(levelname)s %(name)s: %(message)s",
    )
    with tempfile.TemporaryDirectory(prefix="inbox-demo-sms-") as tmp:
        ledger = run_demo(Path(tmp), requests=args.requests, seed=args.seed)
    _print_ledger(ledger)
    return 0 if ledger.exact else 1


if __name__ == "__main__":
    sys.exit(main())
