"""The guards (inbox/core/_guards.py): a handler's commit, rollback or close through the session,
its transaction or the claim's connection is refused before it reaches the database, by
shadowing public method names on those instances; this also fails loudly on a SQLAlchemy
release whose session transaction or connection stops taking instance attributes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Connection, create_engine, func, insert, select
from sqlalchemy.orm import Session, SessionTransaction

from inbox.core._guards import guard, transaction_guards, unguard
from inbox.errors import TransactionControlError
from inbox.schema import inbox_message, metadata

ENDINGS: dict[str, Callable[[Session, SessionTransaction, Connection], object]] = {
    "session.commit()": lambda s, t, c: s.commit(),
    "session.rollback()": lambda s, t, c: s.rollback(),
    "session.close()": lambda s, t, c: s.close(),
    "session.get_transaction().commit()": lambda s, t, c: t.commit(),
    "session.get_transaction().rollback()": lambda s, t, c: t.rollback(),
    "session.connection().commit()": lambda s, t, c: c.commit(),
    "session.connection().rollback()": lambda s, t, c: c.rollback(),
    "session.connection().close()": lambda s, t, c: c.close(),
}


@pytest.mark.parametrize("how", list(ENDINGS))
def test_every_public_way_to_end_the_transaction_is_refused_and_commits_nothing(
    how: str,
) -> None:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    session = Session(engine)
    try:
        transaction = session.begin()
        connection = session.connection()
        session.execute(
            insert(inbox_message).values(message_id=b"k" * 16, handler="h", processed_at=func.now())
        )
        guard(session, transaction, connection, transaction_guards("h"))
        with pytest.raises(TransactionControlError, match="handler 'h'"):
            ENDINGS[how](session, transaction, connection)
        unguard(session, transaction, connection)
        assert not {"commit", "rollback", "close"} & set(vars(connection))
        assert not {"commit", "rollback", "close"} & set(vars(transaction))
        assert not {"commit", "rollback", "close", "reset"} & set(vars(session))
        assert session.get_transaction() is transaction
        assert transaction.is_active
        session.rollback()
    finally:
        session.close()
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(inbox_message)).scalar() == 0
    engine.dispose()


def test_unguard_survives_a_handler_that_deleted_a_guard_itself() -> None:
    engine = create_engine("sqlite://")
    session = Session(engine)
    try:
        transaction = session.begin()
        connection = session.connection()
        guard(session, transaction, connection, transaction_guards("h"))
        del session.commit  # what a handler could do (it must not)
        unguard(session, transaction, connection)
        assert "rollback" not in vars(session)
        assert "commit" not in vars(connection)
        session.commit()
    finally:
        session.close()
    engine.dispose()
