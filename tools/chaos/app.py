"""The chaos harness's consumer app: ``inbox-worker app:inbox`` in each worker process.

One handler, ``ledger.apply`` for type ``op``, inserts one ``chaos_effect`` row per
operation (deduplicated by the ``idempotency-key`` header the harness sets on every copy).
Faults the app injects into itself, from the environment (set by ``run.py``):

* ``CHAOS_FAIL_RATE``: probability that a handler call raises (a transient business error);
* ``CHAOS_POISON_EVERY``: operations whose number is a multiple of it always raise (they must
  end in the dead-letter queue; 0 = none);
* ``CHAOS_KILL_IN_HANDLER``: probability of SIGKILL inside the handler, before the commit;
* ``CHAOS_KILL_AFTER_COMMIT``: probability of SIGKILL after the commit, before the ack.
* ``CHAOS_EFFECT_MODE`` (the effect stage, see effect_stage.py): when set, the handler first
  calls a fake provider through ``inbox.effect`` in this mode; the provider is the file
  ``CHAOS_PROVIDER_FILE``, one ``<op> <key>`` line per call;
* ``CHAOS_KILL_IN_CALL``: probability of SIGKILL inside that call, after the provider has it.
* ``CHAOS_OUTBOX`` (the outbox stage, see outbox_stage.py): when set, the handler also
  publishes a ``followup`` message through the outbox, in its own transaction; relays send
  it to the ``followups`` queue, where ``inbox-worker app:followup_inbox`` (a second inbox,
  with its own claim table) commits one ``chaos_followup`` row per operation, under the same
  kills and handler failures.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import uuid

from chaos_tables import FOLLOWUP_CLAIMS, effects, followups
from sqlalchemy import create_engine, event, insert
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outbox

FAIL_RATE = float(os.environ.get("CHAOS_FAIL_RATE", "0"))
POISON_EVERY = int(os.environ.get("CHAOS_POISON_EVERY", "0"))
KILL_IN_HANDLER = float(os.environ.get("CHAOS_KILL_IN_HANDLER", "0"))
KILL_AFTER_COMMIT = float(os.environ.get("CHAOS_KILL_AFTER_COMMIT", "0"))
EFFECT_MODE = os.environ.get("CHAOS_EFFECT_MODE") or None
PROVIDER_FILE = os.environ.get("CHAOS_PROVIDER_FILE", "")
KILL_IN_CALL = float(os.environ.get("CHAOS_KILL_IN_CALL", "0"))
OUTBOX = bool(os.environ.get("CHAOS_OUTBOX"))
FOLLOWUP_QUEUE = "followups"
_KILL_FLAG = "chaos.kill_after_commit"

engine = create_engine(os.environ["CHAOS_DATABASE_URL"], pool_size=2, pool_pre_ping=True)
sessions = sessionmaker(engine)
inbox = Inbox(sessions, transient_retries=5)
followup_inbox = Inbox(sessions, table=FOLLOWUP_CLAIMS, transient_retries=5)
outbox = Outbox()


def _die(where: str, op: int) -> None:
    os.write(sys.stderr.fileno(), f"chaos: SIGKILL {where} op {op}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


@event.listens_for(sessions, "after_commit")
def _after_commit(session: Session) -> None:
    op = session.info.pop(_KILL_FLAG, None)
    if op is not None:
        _die("after-commit", op)


def _provider_call(op: int, key: uuid.UUID) -> dict[str, str]:
    descriptor = os.open(PROVIDER_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, f"{op} {key}\n".encode())
    finally:
        os.close(descriptor)
    if random.random() < KILL_IN_CALL:
        _die("in-call", op)
    return {"receipt": str(key)}


@inbox.handler("op", name="ledger.apply")
def apply(message: Message, session: Session) -> None:
    op = int(message.body["op"])
    if EFFECT_MODE is not None:
        inbox.effect("provider.call", lambda key: _provider_call(op, key), mode=EFFECT_MODE)
    session.execute(insert(effects).values(op=op, pid=os.getpid()))
    if OUTBOX:
        outbox.publish(session, "followup", {"op": op}, routing_key=FOLLOWUP_QUEUE)
    if POISON_EVERY and op % POISON_EVERY == 0:
        raise ValueError(f"operation {op} is poison")
    _faults(op, session)


@followup_inbox.handler("followup", name="ledger.follow")
def follow(message: Message, session: Session) -> None:
    op = int(message.body["op"])
    session.execute(insert(followups).values(op=op, pid=os.getpid()))
    _faults(op, session)


def _faults(op: int, session: Session) -> None:
    if random.random() < FAIL_RATE:
        raise RuntimeError(f"operation {op}: injected handler failure")
    if random.random() < KILL_IN_HANDLER:
        session.flush()
        _die("in-handler", op)
    if random.random() < KILL_AFTER_COMMIT:
        session.info[_KILL_FLAG] = op
