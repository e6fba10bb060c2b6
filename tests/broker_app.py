"""The app the broker crash tests run in ``inbox-worker broker_app:inbox`` subprocesses.

One handler, ``ops.apply`` for type ``op``, inserts one effects row (ref = ``body["ref"]``).
The environment configures it; the hooks below exist for the tests only, not in the library:

* ``BROKER_APP_DATABASE_URL`` (required): the database the inbox and effects tables live in.
* ``BROKER_APP_STARTED_FILE``: a line with the ref is appended to it when a handler starts,
  so a test knows a handler is in flight (and how many ran).
* ``BROKER_APP_SLOW``: seconds the handler sleeps before returning.
* ``BROKER_APP_KILL_IN_HANDLER``: for this ref the process SIGKILLs itself after inserting the
  effect, before the handler returns (a crash before the commit).
* ``BROKER_APP_KILL_AFTER_COMMIT``: for this ref the process SIGKILLs itself right after the
  commit, before the worker acks (from a session ``after_commit`` event).
* ``BROKER_APP_MARKER``: required with either kill. The kill happens only if this process is
  the one that creates the file, so the redelivery to the next worker runs normally.

The inbox is built at import: the module is imported only by worker subprocesses.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Final

from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from support.effects import record_effect

from inbox import Inbox, Message

HANDLER: Final = "ops.apply"
MESSAGE_TYPE: Final = "op"
_KILL_FLAG: Final = "broker_app.kill_after_commit"


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


_database_url = _env("BROKER_APP_DATABASE_URL")
if _database_url is None:
    raise RuntimeError("broker_app needs BROKER_APP_DATABASE_URL (the test database URL)")
_slow = float(os.environ.get("BROKER_APP_SLOW") or 0)
_started_file = _env("BROKER_APP_STARTED_FILE")
_kill_in_handler = _env("BROKER_APP_KILL_IN_HANDLER")
_kill_after_commit = _env("BROKER_APP_KILL_AFTER_COMMIT")
_marker = _env("BROKER_APP_MARKER")
if (_kill_in_handler or _kill_after_commit) and _marker is None:
    raise RuntimeError("BROKER_APP_KILL_* needs BROKER_APP_MARKER (so only one process dies)")


def _first_to_mark() -> bool:
    """Create the marker file; True only for the one process that created it."""
    assert _marker is not None
    try:
        with open(_marker, "x") as marker:
            marker.write(f"{os.getpid()}\n")
    except FileExistsError:
        return False
    return True


def _die(why: str) -> None:
    os.write(sys.stderr.fileno(), f"broker_app: SIGKILL {why}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


engine = create_engine(_database_url, pool_size=2)
sessions = sessionmaker(engine)
inbox = Inbox(sessions)


@event.listens_for(sessions, "after_commit")
def _after_commit(session: Session) -> None:
    # Runs once the database has committed, inside Inbox.process: the worker has not acked.
    ref = session.info.pop(_KILL_FLAG, None)
    if ref is not None and _first_to_mark():
        _die(f"after the commit of {ref}, before the ack")


@inbox.handler(MESSAGE_TYPE, name=HANDLER)
def apply(message: Message, session: Session) -> None:
    assert isinstance(message.body, dict)
    ref = str(message.body["ref"])
    if _started_file is not None:
        with open(_started_file, "a") as started:
            started.write(f"{ref}\n")
    record_effect(message, session, HANDLER)
    if _slow:
        time.sleep(_slow)
    if ref == _kill_in_handler and _first_to_mark():
        session.flush()  # the effect is written, uncommitted, when the process dies
        _die(f"in the handler of {ref}, before the commit")
    if ref == _kill_after_commit:
        session.info[_KILL_FLAG] = ref
