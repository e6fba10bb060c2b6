"""A worker process for the concurrency tests: processes the same messages as its peers.

Usage: python concurrent_worker.py DATABASE_URL START_AT MESSAGE_ID [MESSAGE_ID ...]

Waits until the wall clock reaches START_AT (so all processes start together), processes
every message in order, and prints one JSON line: outcome counts and any errors.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session, sessionmaker
from support.databases import effects

from inbox import Inbox, Message


def main(argv: list[str]) -> int:
    url, start_at, *ids = argv
    engine = create_engine(url, pool_size=2)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        session.execute(insert(effects).values(ref=str(message.id), handler="billing.charge"))
        time.sleep(0.001)  # widen the window in which peers collide on the uncommitted claim

    messages = [Message(id=i, type="order.created", body={}) for i in ids]
    with engine.connect():
        pass  # connect before the start line, so the race is on the claims, not on connecting
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    time.sleep(max(0.0, float(start_at) - time.time()))
    for message in messages:
        try:
            outcomes[inbox.process(message).outcome.value] += 1
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"outcomes": outcomes, "errors": errors}))
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
