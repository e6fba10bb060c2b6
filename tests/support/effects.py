"""Handlers and message builders shared by the tests: every test handler commits one row in
the ``effects`` table, so a doubled or lost effect is a count, not a guess."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from sqlalchemy import insert
from sqlalchemy.orm import Session

from inbox import Inbox, Message
from support.databases import effects


def record_effect(message: Message, session: Session, handler: str) -> None:
    """The business effect every test handler commits: one row naming message and handler."""
    ref = str(message.body["ref"]) if isinstance(message.body, dict) else str(message.id)
    session.execute(insert(effects).values(ref=ref, handler=handler))


class Recorder:
    """Registers effect-writing handlers on an inbox and counts how often each one ran."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, int] = {}

    def add(
        self,
        name: str,
        message_type: str | None = None,
        *,
        key: Callable[[Message], object] | None = None,
    ) -> None:
        """A handler ``name`` that writes one effect, failing while ``self.fail[name] > 0``."""

        def handler(message: Message, session: Session) -> None:
            self.calls[name] += 1
            record_effect(message, session, name)
            if self.fail.get(name, 0) > 0:
                self.fail[name] -= 1
                raise RuntimeError(f"{name} failed on purpose")

        self.inbox.handler(message_type, name=name, key=key)(handler)  # type: ignore[arg-type]


def order(ref: object, message_type: str = "order.created", **headers: str) -> Message:
    """A fresh message (new UUIDv7 id) for the business operation ``ref``."""
    return Message.new(message_type, {"ref": ref}, headers or None)
