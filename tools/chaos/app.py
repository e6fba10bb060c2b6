"""The chaos harness's consumer app: ``inbox-worker app:inbox`` in each worker process.

One handler, ``ledger.apply`` for type ``op``, inserts one ``chaos_effect`` row per
operation (deduplicated by the ``idempotency-key`` header the harness sets on every copy).
Faults the app injects into itself, from the environment (set by ``run.py``):

* ``CHAOS_FAIL_RATE``: probability that a handler call raises (a transient business error);
* ``CHAOS_POISON_EVERY``: operations whose number is a multiple of it always raise (they must
  end in the dead-letter queue; 0 = none);
* ``CHAOS_KILL_IN_HANDLER``: probability of SIGKILL inside the handler, before the commit;
* ``CHAOS_KILL_AFTER_COMMIT``: probability of SIGKILL after the commit, before the ack.
"""

from __future__ import annotations

import os
import random
import signal
import sys

from chaos_tables import effects
from sqlalchemy import create_engine, event, insert
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message

FAIL_RATE = float(os.environ.get("CHAOS_FAIL_RATE", "0"))
POISON_EVERY = int(os.environ.get("CHAOS_POISON_EVERY", "0"))
KILL_IN_HANDLER = float(os.environ.get("CHAOS_KILL_IN_HANDLER", "0"))
KILL_AFTER_COMMIT = float(os.environ.get("CHAOS_KILL_AFTER_COMMIT", "0"))
_KILL_FLAG = "chaos.kill_after_commit"

engine = create_engine(os.environ["CHAOS_DATABASE_URL"], pool_size=2, pool_pre_ping=True)
sessions = sessionmaker(engine)
inbox = Inbox(sessions, transient_retries=5)


def _die(where: str, op: int) -> None:
    os.write(sys.stderr.fileno(), f"chaos: SIGKILL {where} op {op}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


@event.listens_for(sessions, "after_commit")
def _after_commit(session: Session) -> None:
    op = session.info.pop(_KILL_FLAG, None)
    if op is not None:
        _die("after-commit", op)


@inbox.handler("op", name="ledger.apply")
def apply(message: Message, session: Session) -> None:
    op = int(message.body["op"])
    session.execute(insert(effects).values(op=op, pid=os.getpid()))
    if POISON_EVERY and op % POISON_EVERY == 0:
        raise ValueError(f"operation {op} is poison")
    if random.random() < FAIL_RATE:
        raise RuntimeError(f"operation {op}: injected handler failure")
    if random.random() < KILL_IN_HANDLER:
        session.flush()
        _die("in-handler", op)
    if random.random() < KILL_AFTER_COMMIT:
        session.info[_KILL_FLAG] = op
