"""The database going away around a handler (a failover, a Galera node killed): the delivery
fails with the connection error and is retried, never dead-lettered for a reason it does not
have. Found by tools/cluster/galera_conflicts.py, where a node kill dead-lettered messages."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pymysql
import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from inbox import HandlerFailed, Inbox, Message, TransactionControlError
from inbox.core import _misuse
from inbox.delivery._policy import Retry, decide
from inbox.delivery.topology import RetryPolicy


@pytest.mark.parametrize(
    "url",
    ["mysql+pymysql://root@127.0.0.1:1/test", "postgresql+psycopg://postgres@127.0.0.1:1/test"],
)
def test_a_server_that_cannot_be_reached_fails_the_try_with_its_own_error(url: str) -> None:
    engine = create_engine(url)
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("op", name="h")(lambda message, session: None)
    try:
        with pytest.raises(HandlerFailed) as raised:
            inbox.process(Message.new("op", {}))
    finally:
        engine.dispose()

    # Not an AttributeError from the inbox's own clean-up hiding the connection error.
    assert isinstance(raised.value.failures["h"], OperationalError)
    assert isinstance(decide(raised.value, 0, RetryPolicy()), Retry)


class _NoConnection(Session):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def connection(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise self.error


def _early_commit(error: Exception) -> bool:
    return _misuse.early_commit(
        _NoConnection(error),
        SimpleNamespace(bind_clause=None),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # not reached: the connection fails first
        RuntimeError("the handler failed"),
        (b"k" * 16, "h"),
        at=dt.datetime.now(dt.UTC),
    )


def test_a_claim_check_that_cannot_reach_the_server_leaves_the_decision_to_the_redelivery() -> None:
    refused = OperationalError(
        "connect", {}, pymysql.err.OperationalError(2003, "Can't connect to MySQL server")
    )
    assert _early_commit(refused) is False


def test_a_claim_check_refused_for_another_reason_is_still_a_transaction_control_error() -> None:
    denied = ProgrammingError(
        "SELECT", {}, pymysql.err.ProgrammingError(1142, "SELECT command denied")
    )
    with pytest.raises(TransactionControlError):
        _early_commit(denied)
