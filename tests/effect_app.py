"""The app the effect crash tests run in ``inbox-worker effect_app:inbox`` subprocesses.

One handler, ``sms.send`` for type ``op``: it sends an SMS through a fake provider (a file
it appends the idempotency key to, so calls survive the process) inside ``inbox.effect``,
then commits one effects row (ref = ``body["ref"]``). The environment configures it:

* ``EFFECT_APP_DATABASE_URL`` (required): the database of the inbox, effects and effect
  records.
* ``EFFECT_APP_PROVIDER_FILE`` (required): the fake provider's file of calls.
* ``EFFECT_APP_MODE``: the effect's mode (default ``at-least-once``).
* ``EFFECT_APP_KILL``: where the process SIGKILLs itself, once (see ``EFFECT_APP_MARKER``):
  ``in-call`` (the provider has the request, the call has not returned), ``after-call``
  (the call returned, the done record is not written), ``after-done`` (the done record is
  committed, the handler's transaction is not).
* ``EFFECT_APP_MARKER``: required with a kill; only the process that creates it dies.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from typing import Any, Final

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from support.effects import record_effect
from support.ledger import FileProvider

from inbox import Inbox, Message

HANDLER: Final = "sms.send"
KILL_POINTS: Final = ("in-call", "after-call", "after-done")

_database_url = os.environ["EFFECT_APP_DATABASE_URL"]
_provider = FileProvider(os.environ["EFFECT_APP_PROVIDER_FILE"])
_mode = os.environ.get("EFFECT_APP_MODE") or "at-least-once"
_kill = os.environ.get("EFFECT_APP_KILL") or None
_marker = os.environ.get("EFFECT_APP_MARKER") or None
if _kill is not None and (_kill not in KILL_POINTS or _marker is None):
    raise RuntimeError(f"EFFECT_APP_KILL must be one of {KILL_POINTS}, with EFFECT_APP_MARKER")


def _die_at(point: str) -> None:
    if _kill != point:
        return
    assert _marker is not None
    try:
        with open(_marker, "x") as marker:
            marker.write(f"{os.getpid()}\n")
    except FileExistsError:
        return
    os.write(sys.stderr.fileno(), f"effect_app: SIGKILL {point}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


engine = create_engine(_database_url, pool_size=3)
inbox = Inbox(sessionmaker(engine))


@event.listens_for(Engine, "before_cursor_execute")
def _before_done_record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    # The done record is the UPDATE of the effect table that stores a result (on the
    # ledger's engine beside the inbox's: every engine is listened to).
    if statement.startswith("UPDATE inbox_effect") and "result" in statement:
        _die_at("after-call")


def _send(key: uuid.UUID) -> dict[str, str]:
    receipt = _provider.send(key)
    _die_at("in-call")
    return receipt


@inbox.handler("op", name=HANDLER)
def send_sms(message: Message, session: Session) -> None:
    inbox.effect("provider.send", _send, mode=_mode)
    _die_at("after-done")
    record_effect(message, session, HANDLER)
