"""Least privilege on PostgreSQL, as the README documents it: the worker's role needs INSERT
on the inbox table and SELECT on its two key columns (``ON CONFLICT (message_id, handler)``
reads them); it never deletes or updates a claim. The cleanup job's role needs SELECT, UPDATE
(for the batch's ``FOR UPDATE SKIP LOCKED``) and DELETE."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import record_effect

from inbox import ClaimCommittedEarly, HandlerFailed, Inbox, Message, Outcome, cleanup
from inbox.retention._pg_walk import _LOCK_SPACE
from inbox.schema import metadata


@pytest.fixture
def role(pg_db: Database) -> Iterator[str]:
    name = f"inbox_role_{uuid.uuid4().hex[:10]}"
    schema = make_url(pg_db.url).query["options"].removeprefix("-csearch_path=")
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"CREATE ROLE {name} LOGIN"))
        connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {name}"))
    try:
        yield name
    finally:
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP OWNED BY {name}"))
            connection.execute(text(f"DROP ROLE {name}"))


def as_role(pg_db: Database, role: str) -> str:
    return make_url(pg_db.url).set(username=role).render_as_string(hide_password=False)


def test_the_worker_needs_insert_and_select_on_the_claim_columns(
    pg_db: Database, role: str
) -> None:
    inbox_table = metadata.tables["inbox_message"]
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"GRANT INSERT ON inbox_message TO {role}"))
        connection.execute(text(f"GRANT INSERT, SELECT ON effects TO {role}"))  # the app's table
        connection.execute(text(f"GRANT USAGE ON SEQUENCE effects_id_seq TO {role}"))
    engine = create_engine(as_role(pg_db, role))
    try:
        inbox = Inbox(sessionmaker(engine))

        @inbox.handler("op", name="ops.apply")
        def apply(message: Message, session: Session) -> None:
            record_effect(message, session, "ops.apply")

        message = Message.new("op", {"ref": "r1"})
        with pytest.raises(HandlerFailed) as insert_only:
            inbox.process(message)
        assert "permission denied" in str(insert_only.value.failures["ops.apply"])
        with pg_db.engine.begin() as connection:
            connection.execute(
                text(f"GRANT SELECT (message_id, handler) ON inbox_message TO {role}")
            )
        assert inbox.process(message).outcome is Outcome.PROCESSED
        assert inbox.process(message).outcome is Outcome.DUPLICATE

        @inbox.handler("early", name="ops.early")
        def early(message: Message, session: Session) -> None:
            session.execute(text("COMMIT"))
            raise RuntimeError("after an early commit")

        # Telling an early commit from a plain failure reads the claim's processed_at:
        # without it the inbox says it could not check, rather than retry into a duplicate.
        with pytest.raises(HandlerFailed) as unchecked:
            inbox.process(Message.new("early", {"ref": "r2"}))
        assert "could not be checked" in str(unchecked.value.failures["ops.early"])
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"GRANT SELECT (processed_at) ON inbox_message TO {role}"))
        with pytest.raises(HandlerFailed) as checked:
            inbox.process(Message.new("early", {"ref": "r3"}))
        assert isinstance(checked.value.failures["ops.early"], ClaimCommittedEarly)
        with pytest.raises(ProgrammingError, match="permission denied"), engine.begin() as c:
            c.execute(inbox_table.delete())
    finally:
        engine.dispose()
    assert pg_db.effect_counts() == {("r1", "ops.apply"): 1}


def test_cleanup_needs_select_and_delete_and_update_beside_another(
    pg_db: Database, role: str
) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    claims = metadata.tables["inbox_message"]

    def expire_two() -> None:
        with pg_db.engine.begin() as connection:
            rows = [{"message_id": uuid.uuid4().bytes, "handler": "h", "processed_at": old}] * 2
            connection.execute(
                insert(claims), [dict(r, message_id=uuid.uuid4().bytes) for r in rows]
            )

    expire_two()
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"GRANT SELECT, DELETE ON inbox_message TO {role}"))
        # Effect records go with their claims: selected through them, deleted by key.
        connection.execute(text(f"GRANT SELECT, DELETE ON inbox_effect TO {role}"))
        # So do Celery task results, where the table is (the migrations create it).
        connection.execute(text(f"GRANT SELECT, DELETE ON inbox_task_result TO {role}"))
    url = as_role(pg_db, role)
    assert cleanup(url, days=30).deleted == 2  # one cleanup alone: a plain DELETE
    expire_two()
    # Beside another cleanup of the table (its batch holding the walker's lock), a cleanup
    # picks its rows FOR UPDATE SKIP LOCKED, which needs UPDATE as well.
    with walker_lock_held(pg_db.url):
        with pytest.raises(ProgrammingError, match="permission denied"):
            cleanup(url, days=30)
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"GRANT UPDATE ON inbox_message TO {role}"))
        assert cleanup(url, days=30).deleted == 2
    assert pg_db.count(claims) == 0


@contextmanager
def walker_lock_held(url: str) -> Iterator[None]:
    """The advisory lock a running cleanup's batch holds on the inbox table."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            key = connection.execute(
                text("SELECT CAST(CAST(to_regclass('inbox_message') AS oid) AS int4)")
            ).scalar_one()
            connection.execute(select(func.pg_advisory_lock(_LOCK_SPACE, key)))
            connection.commit()
            yield
            connection.execute(select(func.pg_advisory_unlock(_LOCK_SPACE, key)))
            connection.commit()
    finally:
        engine.dispose()
