"""Prints what ``inbox-worker --metrics-port`` serves on /metrics after a little of everything:
handlers committed, a duplicate, a failure, a retry, a dead letter, effects, outbox rows sent
and refused, the scrape-time gauges. Run as a script of its own (OpenTelemetry's meter
provider can be set once per process) by tests/test_monitoring.py."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.schema import metadata
from inbox.telemetry import record_outbox
from inbox.telemetry._gauges import observe_worker
from inbox.telemetry._prometheus import prometheus_exposition
from inbox.testing import WorkerHarness


def main(folder: Path) -> None:
    render = prometheus_exposition()
    observe_worker(lambda: True, lambda: (3, dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)))
    engine = create_engine(f"sqlite:///{folder / 'scrape.db'}")
    metadata.create_all(engine)
    effects = create_engine(f"sqlite:///{folder / 'effects.db'}")
    metadata.create_all(effects)
    inbox = Inbox(sessionmaker(engine), effect_store=effects)

    @inbox.handler("order.created", name="orders.apply")
    def apply(message: Message, session: Session) -> None:
        inbox.effect("sms.send", lambda key: {"id": str(key)})

    @inbox.handler("order.failed", name="orders.fail")
    def fail(message: Message, session: Session) -> None:
        raise RuntimeError("no")

    message = Message.new("order.created", {"n": 1})
    inbox.process(message)
    inbox.process(message)  # a duplicate
    with WorkerHarness(inbox) as harness:
        harness.publish("order.created", {"n": 2})
        harness.publish("order.failed", {"n": 3})  # retried, then dead-lettered
        harness.run()
    record_outbox(sent=2, refused=1, destination="orders")
    body, _ = render()
    sys.stdout.write(body.decode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
