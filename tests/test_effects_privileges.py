"""Least privilege for effects on PostgreSQL, as docs/effects.md documents it: the worker's
role needs SELECT, INSERT and UPDATE on inbox_effect (the cleanup role's SELECT and DELETE are
checked in test_privileges.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import order, record_effect
from support.ledger import Provider, records

from inbox import HandlerFailed, Inbox, Message, Outcome


@pytest.fixture
def role(pg_db: Database) -> Iterator[str]:
    name = f"inbox_effect_role_{uuid.uuid4().hex[:8]}"
    schema = make_url(pg_db.url).query["options"].removeprefix("-csearch_path=")
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"CREATE ROLE {name} LOGIN"))
        connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {name}"))
        connection.execute(text(f"GRANT INSERT, SELECT ON inbox_message TO {name}"))
        connection.execute(text(f"GRANT INSERT, SELECT ON effects TO {name}"))
        connection.execute(text(f"GRANT USAGE ON SEQUENCE effects_id_seq TO {name}"))
    try:
        yield name
    finally:
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP OWNED BY {name}"))
            connection.execute(text(f"DROP ROLE {name}"))


def test_the_worker_needs_select_insert_and_update_on_the_effect_table(
    pg_db: Database, role: str
) -> None:
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"GRANT SELECT, INSERT ON inbox_effect TO {role}"))
    engine = create_engine(make_url(pg_db.url).set(username=role))
    provider = Provider()
    try:
        inbox = Inbox(sessionmaker(engine))

        @inbox.handler("sms.requested", name="sms.send")
        def send(message: Message, session: Session) -> None:
            inbox.effect("provider.send", provider.send)
            record_effect(message, session, "sms.send")

        message = order("r1", "sms.requested")
        with pytest.raises(HandlerFailed) as denied:
            inbox.process(message)
        assert "permission denied for table inbox_effect" in str(denied.value)
        assert len(provider.calls) == 1  # started was recorded, the call made; done was not
        [record] = records(pg_db.engine)
        assert record["status"] == "started"  # not done without its result: nothing refused it
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"GRANT UPDATE ON inbox_effect TO {role}"))
        # The retry in this process records the result it kept: no second call.
        assert inbox.process(message).outcome is Outcome.PROCESSED
    finally:
        engine.dispose()
    assert len(provider.calls) == 1
    [record] = records(pg_db.engine)
    assert (record["status"], record["attempts"]) == ("done", 1)
    assert pg_db.effect_counts() == {("r1", "sms.send"): 1}
