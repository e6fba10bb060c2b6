"""The one exception to "no lease": a live process whose database connection is killed while
its call runs. Its claim rolls back, so a concurrent duplicate delivery claims and finds the
effect started. At-least-once calls again with the SAME key (two calls, one key); at-most-once
raises UncertainEffect (one call). The lost attempt's late record never overwrites the
attempt that took over, and the delivery row is committed once either way."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import order, record_effect
from support.ledger import Provider, records
from support.worker import TIMEOUT, wait_until

from inbox import HandlerFailed, Inbox, Message, Outcome, ProcessResult, UncertainEffect

HANDLER = "sms.send"


def backend_id(session: Session) -> int:
    dialect = session.get_bind().dialect.name
    query = "SELECT pg_backend_pid()" if dialect == "postgresql" else "SELECT CONNECTION_ID()"
    return int(session.execute(text(query)).scalar_one())


def someone_waits_on_a_lock(admin: Engine, backend: str) -> bool:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        if backend == "postgresql"
        # The claim INSERT still running is B waiting on A's uncommitted claim row.
        else "SELECT count(*) FROM information_schema.processlist "
        "WHERE command = 'Query' AND info LIKE 'INSERT INTO inbox_message%'"
    )
    with admin.connect() as connection:
        return bool(connection.execute(text(query)).scalar_one())


def kill_backend(admin: Engine, backend: str, ident: int) -> None:
    with admin.connect() as connection:
        if backend == "postgresql":
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": ident})
        else:
            connection.execute(text(f"KILL CONNECTION {int(ident)}"))


class Attempts:
    """The first handler run (A) blocks inside its call until released; later runs don't."""

    def __init__(self, inbox: Inbox, mode: str) -> None:
        self.provider = Provider()
        self.a_in_call = threading.Event()
        self.release_a = threading.Event()
        self.a_backend: int | None = None
        self.runs = 0
        self._lock = threading.Lock()

        @inbox.handler("sms.requested", name=HANDLER)
        def send_sms(message: Message, session: Session) -> None:
            with self._lock:
                self.runs += 1
                first = self.runs == 1
            if first:
                self.a_backend = backend_id(session)
            inbox.effect("provider.send", self._call_a if first else self.provider.send, mode=mode)
            record_effect(message, session, HANDLER)

    def _call_a(self, key: uuid.UUID) -> dict[str, Any]:
        receipt = self.provider.send(key)
        self.a_in_call.set()
        assert self.release_a.wait(TIMEOUT), "attempt A was never released"
        return receipt


def process_in_thread(inbox: Inbox, message: Message) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(inbox.process(message))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("mode", ["at-least-once", "at-most-once"])
def test_a_killed_connection_mid_call_and_a_concurrent_duplicate(
    server_db: Database, admin_engines: dict[str, Engine], mode: str
) -> None:
    inbox = Inbox(server_db.sessions)
    attempts = Attempts(inbox, mode)
    message = order("m1", "sms.requested")

    thread_a, outcome_a = process_in_thread(inbox, message)
    assert attempts.a_in_call.wait(TIMEOUT)
    thread_b, outcome_b = process_in_thread(inbox, message)
    admin = admin_engines[server_db.backend]
    wait_until(lambda: someone_waits_on_a_lock(admin, server_db.backend), "B on A's claim")
    assert attempts.a_backend is not None
    kill_backend(admin, server_db.backend, attempts.a_backend)
    thread_b.join(TIMEOUT)
    assert not thread_b.is_alive()
    attempts.release_a.set()
    thread_a.join(TIMEOUT)
    assert not thread_a.is_alive()

    [a], [b] = outcome_a, outcome_b
    [record] = records(server_db.engine)
    key = record["effect_key"]
    if mode == "at-least-once":
        # B took over as attempt 2 and committed; A's late 'done' did not overwrite it, and
        # A's re-run (its connection was lost: transient) found B's claim.
        assert attempts.provider.calls == [key, key]
        assert isinstance(b, ProcessResult)
        assert b.outcome is Outcome.PROCESSED
        assert isinstance(a, ProcessResult)
        assert a.outcome is Outcome.DUPLICATE
        assert (record["status"], record["attempts"]) == ("done", 2)
    else:
        # B found A's call started and refused to call; A's call finished as attempt 1 and
        # A's re-run returned its stored result.
        assert attempts.provider.calls == [key]
        assert isinstance(b, HandlerFailed)
        assert isinstance(b.failures[HANDLER], UncertainEffect)
        assert isinstance(a, ProcessResult)
        assert a.outcome is Outcome.PROCESSED
        assert (record["status"], record["attempts"]) == ("done", 1)
    assert server_db.effect_counts() == {("m1", HANDLER): 1}
