"""A worker that starts while its PostgreSQL fails over (Patroni, a multi-host URL) meets a
standby that is not consistent yet: that is a server worth waiting for, not a final error."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from inbox.core._startup import _unreachable


@pytest.mark.parametrize(
    "fatal",
    [
        "the database system is not yet accepting connections\n"
        "DETAIL:  Consistent recovery state has not been yet reached.",
        "the database system is not accepting connections\nDETAIL:  Hot standby mode is disabled.",
        "the database system is starting up",
    ],
)
def test_a_standby_not_yet_accepting_connections_is_waited_for(fatal: str) -> None:
    orig = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5451 failed: '
        f"FATAL:  {fatal}\nMultiple connection attempts failed. All failures were:\n"
        "- host: '127.0.0.1', port: '5452': connection refused"
    )
    assert _unreachable(OperationalError("connect", {}, orig)) is True


def test_a_refused_login_is_still_final() -> None:
    orig = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5451 failed: '
        'FATAL:  password authentication failed for user "app"'
    )
    assert _unreachable(OperationalError("connect", {}, orig)) is False
