"""What the console tests share: a console on a test's database and broker, dead letters
as the worker writes them, an uncertain effect made by a real at-most-once effect, and an
outbox row the broker refused."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from html import unescape
from typing import Any, Final

from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.rabbit import Rabbit

from inbox import Inbox, Message, Outbox
from inbox.broker import Relay
from inbox.console import ConsoleSettings, Credentials
from inbox.delivery import headers as h
from inbox.errors import HandlerFailed
from inbox.operations._dead_letters import dead_letter_queue, open_channel, publish_confirmed
from inbox.operations._tables import Tables
from inbox.schema import effect_table, inbox_table, outbox_table

TOKEN: Final = "s3cret-console-token-for-tests"
PASSWORD: Final = "s3cret-console-password"
SMS_HANDLER: Final = "sms.send"
SMS_STEP: Final = "provider.send"


def tables() -> Tables:
    """The default tables, on metadata of their own."""
    metadata = MetaData()
    return Tables(inbox_table(metadata), effect_table(metadata), outbox_table(metadata))


def settings(
    db: Database,
    rabbit: Rabbit | None,
    queues: tuple[str, ...] = (),
    *,
    allow_actions: bool = True,
    max_body: int = 4096,
    allow_hard_purge: bool | None = None,
) -> ConsoleSettings:
    """A console on the test's database (and broker, with ``queues``)."""
    return ConsoleSettings(
        db.engine,
        tables(),
        Credentials(token=TOKEN, user="alice", password=PASSWORD),
        rabbit.url if rabbit else None,
        queues,
        allow_actions=allow_actions,
        # The purge tests purge: a console that allows actions allows it unless told not to.
        allow_hard_purge=allow_actions if allow_hard_purge is None else allow_hard_purge,
        max_body=max_body,
    )


def declare_queues(rabbit: Rabbit, queue: str) -> None:
    """The worker's queue and its dead-letter queue, plain (no worker needed)."""
    with open_channel(rabbit.url) as channel:
        for name in (queue, dead_letter_queue(queue)):
            channel.queue_declare(queue=name, durable=True, auto_delete=False)


def dead_letter(
    rabbit: Rabbit,
    queue: str,
    body: bytes | None = None,
    *,
    reason: str = "handler-failed",
    message_id: str | None = None,
    ref: str = "r1",
    error: str = "ValueError: poison r1",
    dead_lettered_at: dt.datetime | None = None,
    more_headers: dict[str, Any] | None = None,
) -> str:
    """Put one dead letter in ``queue``'s .dlq with the headers the worker writes (and
    ``more_headers``, the application's); return its message id."""
    message_id = message_id or str(uuid.uuid4())
    now = dead_lettered_at or dt.datetime.now(dt.UTC)
    headers: dict[str, Any] = {
        h.REASON: reason,
        h.TRIES: 3,
        h.FAILED_HANDLERS: "ops.apply",
        h.ERROR: error,
        h.SOURCE_QUEUE: queue,
        h.FIRST_FAILURE: (now - dt.timedelta(seconds=30)).isoformat(),
        h.LAST_FAILURE: (now - dt.timedelta(seconds=5)).isoformat(),
        h.DEAD_LETTERED_AT: now.isoformat(),
        **(more_headers or {}),
    }
    properties = {
        "message_id": message_id,
        "type": "op",
        "content_type": "application/json",
        "delivery_mode": 2,
        "application_headers": headers,
    }
    payload = body if body is not None else json.dumps({"ref": ref}).encode()
    with open_channel(rabbit.url) as channel:
        publish_confirmed(channel, payload, properties, dead_letter_queue(queue))
    return message_id


@dataclass
class Sms:
    """An at-most-once SMS effect whose provider fails (or seems to) on the first call."""

    db: Database
    calls: list[uuid.UUID] = field(default_factory=list)
    seen: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inbox = Inbox(sessionmaker(self.db.engine))

        def send(message: Message, session: Session) -> None:
            def call(key: uuid.UUID) -> dict[str, str]:
                self.calls.append(key)
                if len(self.calls) == 1:
                    raise TimeoutError("provider timed out: was it sent?")
                return {"id": f"sms-{len(self.calls)}"}

            self.seen.append(self.inbox.effect(SMS_STEP, call, mode="at-most-once"))

        self.inbox.handler("sms.requested", name=SMS_HANDLER)(send)
        self.message = Message.new("sms.requested", {"phone": "+100", "text": "hi"})

    def fail_once(self) -> uuid.UUID:
        """Process the message: the call fails, the effect is uncertain; its key."""
        try:
            self.inbox.process(self.message)
        except HandlerFailed:
            pass
        else:
            raise AssertionError("the first attempt should have failed")
        table = tables().effects
        with self.db.engine.connect() as connection:
            key: uuid.UUID = connection.execute(select(table.c.effect_key)).scalar_one()
        return key

    def process(self) -> None:
        """Process the message again (a replay)."""
        self.inbox.process(self.message)


def refused_outbox_row(db: Database, rabbit: Rabbit, routing_key: str) -> uuid.UUID:
    """An outbox row to a queue that does not exist, refused once by a real relay; its id."""
    outbox = Outbox()
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "order.shipped", {"ref": "o1"}, routing_key=routing_key)
    relay = Relay(db.engine, rabbit.url, poll_interval=0.1, max_retry_delay=0.2, listen=False)
    try:
        relay.drain()
    finally:
        relay.close()
    table = tables().outbox
    with db.engine.connect() as connection:
        row_id, attempts = connection.execute(select(table.c.id, table.c.attempts)).one()
    assert attempts >= 1, "the relay should have been refused"
    return uuid.UUID(str(row_id))


CSRF: Final = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = CSRF.search(html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


HIDDEN: Final = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


def confirmation(html: str) -> dict[str, list[str]]:
    """The fields a confirmation page's form posts (its hidden inputs, each name with its
    values in order): what its button sends."""
    form = html.rsplit('<form method="post"', maxsplit=1)[-1].split("</form>", maxsplit=1)[0]
    fields: dict[str, list[str]] = {}
    for name, value in HIDDEN.findall(form):
        fields.setdefault(name, []).append(unescape(value))
    assert fields.get("confirmed") == ["yes"], "the page has no confirmation form"
    return fields


Check = Callable[[], bool]
