"""The app the admin and log tests run in ``inbox-worker admin_app:inbox`` subprocesses.

Two handlers for type ``op``: ``ops.audit`` records one effects row (ref = ``body["ref"]``)
and never fails; ``ops.apply`` records one too, except:

* a ref starting with ``bad`` raises ValueError while the file ``ADMIN_APP_POISON_FILE``
  exists (a poison message, until the cause is fixed by removing the file);
* a ref starting with ``sql`` runs an INSERT that every database refuses, with a customer's
  name and address as a bound parameter (:data:`CUSTOMER`), which no log line and no header
  may show.

``ADMIN_APP_DATABASE_URL`` names the database. The worker calls :func:`make_inbox`
(``inbox-worker admin_app:make_inbox``); tests import the constants.
"""

from __future__ import annotations

import os
from typing import Final

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker
from support.effects import record_effect

from inbox import Inbox, Message

HANDLER: Final = "ops.apply"
AUDIT: Final = "ops.audit"
MESSAGE_TYPE: Final = "op"
CUSTOMER: Final = "Zelda Quaxington, 12 Elm Street"


def make_inbox() -> Inbox:
    """The app's inbox on ``ADMIN_APP_DATABASE_URL``."""
    url = os.environ.get("ADMIN_APP_DATABASE_URL")
    if not url:
        raise RuntimeError("admin_app needs ADMIN_APP_DATABASE_URL (the test database URL)")
    inbox = Inbox(sessionmaker(create_engine(url)))
    inbox.handler(MESSAGE_TYPE, name=AUDIT)(audit)
    inbox.handler(MESSAGE_TYPE, name=HANDLER)(apply)
    return inbox


def audit(message: Message, session: Session) -> None:
    record_effect(message, session, AUDIT)


def apply(message: Message, session: Session) -> None:
    assert isinstance(message.body, dict)
    ref = str(message.body["ref"])
    poison_file = os.environ.get("ADMIN_APP_POISON_FILE")
    if ref.startswith("bad") and poison_file and os.path.exists(poison_file):
        raise ValueError(f"poison {ref}")
    if ref.startswith("sql"):
        # An integer column given text: PostgreSQL and MariaDB quote the value in the error.
        session.execute(
            text("INSERT INTO effects (id, ref, handler) VALUES (:customer, :ref, :handler)"),
            {"customer": CUSTOMER, "ref": ref, "handler": HANDLER},
        )
    record_effect(message, session, HANDLER)
