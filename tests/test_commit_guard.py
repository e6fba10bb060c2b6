"""Canary for the one SQLAlchemy internal the inbox relies on (inbox/_commit_guard.py):
``Connection._commit_impl``, the step every commit of a connection's transaction goes
through. If a SQLAlchemy release changes it, these fail loudly, before a handler's commit
slips past the guard."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from sqlalchemy import Connection, create_engine, func, insert, select
from sqlalchemy.orm import Session

from inbox._commit_guard import CONNECTION_COMMIT_STEP, guard, transaction_guards, unguard
from inbox.errors import TransactionControlError
from inbox.schema import inbox_message, metadata

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_installed_sqlalchemy_is_within_the_bound_this_canary_was_run_for() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (requirement,) = [Requirement(d) for d in dependencies if d.startswith("SQLAlchemy")]
    assert any(spec.operator == "<" for spec in requirement.specifier), "no upper bound"
    assert requirement.specifier.contains(version("sqlalchemy"))


def test_the_commit_step_is_a_method_of_connection() -> None:
    step = getattr(Connection, CONNECTION_COMMIT_STEP, None)
    assert callable(step)


@pytest.mark.parametrize("how", ["connection.commit()", "session.get_transaction().commit()"])
def test_commits_past_the_session_methods_are_stopped_at_the_shadowed_step(how: str) -> None:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    session = Session(engine)
    try:
        session.begin()
        connection = session.connection()
        claim = insert(inbox_message).values(
            message_id=b"k" * 16, handler="h", processed_at=func.now()
        )
        session.execute(claim)
        transaction = session.get_transaction()
        assert transaction is not None
        commit = connection.commit if how == "connection.commit()" else transaction.commit
        guard(session, connection, transaction_guards("h"))
        # "with a commit" is the connection step's refusal, not a session method's.
        with pytest.raises(TransactionControlError, match="with a commit"):
            commit()
        unguard(session, connection)
        assert CONNECTION_COMMIT_STEP not in connection.__dict__
        type(session).rollback(session)
    finally:
        session.close()
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(inbox_message)).scalar() == 0
    engine.dispose()
