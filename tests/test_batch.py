"""Inbox.process_batch on every backend: one transaction and one claim statement per handler
for many messages, results in input order, a failing message isolated by bisecting the batch,
transient errors retried for the whole batch, and concurrent batches that never deadlock."""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects_metadata
from support.effects import order, record_effect

from inbox import (
    HandlerFailed,
    Inbox,
    InboxError,
    InvalidKey,
    Message,
    Outcome,
    ProcessResult,
    TransactionControlError,
    UnhandledMessage,
)
from inbox.message import key_bytes
from inbox.result import Unhandled
from inbox.schema import inbox_message, inbox_table
from inbox.schema import metadata as inbox_metadata

P = Outcome.PROCESSED
D = Outcome.DUPLICATE


def ref_of(message: Message) -> str:
    assert isinstance(message.body, dict)
    return str(message.body["ref"])


class Journal:
    """Registers handlers that write one effect row, log every call as (ref, handler), and
    raise when ``fails(ref)`` says so (after writing: the effect must roll back)."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.calls: list[tuple[str, str]] = []

    def add(
        self,
        name: str,
        message_type: str | None = None,
        *,
        key: Callable[[Message], object] | None = None,
        fails: Callable[[str], bool] = lambda ref: False,
    ) -> None:
        def handler(message: Message, session: Session) -> None:
            ref = ref_of(message)
            self.calls.append((ref, name))
            record_effect(message, session, name)
            if fails(ref):
                raise RuntimeError(f"{name} fails on {ref}")

        self.inbox.handler(message_type, name=name, key=key)(handler)  # type: ignore[arg-type]


def claim_set(db: Database) -> set[tuple[uuid.UUID, str]]:
    with db.engine.connect() as connection:
        rows = connection.execute(select(inbox_message.c.message_id, inbox_message.c.handler))
        return {(message_id, handler) for message_id, handler in rows}


def key_uuid(key: str) -> uuid.UUID:
    """The stored message_id of a string business key."""
    return uuid.UUID(bytes=key_bytes(key))


def outcomes_of(results: Sequence[ProcessResult | InboxError]) -> list[object]:
    """Each result as its outcomes dict, or the error's type."""
    return [r.outcomes if isinstance(r, ProcessResult) else type(r) for r in results]


def count_commits(sessions: sessionmaker[Session]) -> list[int]:
    """A one-element counter of the transactions the sessions commit."""
    commits = [0]

    @event.listens_for(sessions, "after_commit")
    def _count(session: Session) -> None:
        commits[0] += 1

    return commits


# --- exactly once, results in input order, handler order -------------------------------------


def test_a_mixed_batch_gives_one_result_per_message_in_order_and_each_effect_once(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    journal = Journal(inbox)
    journal.add("billing.charge", "order.created")
    journal.add("audit.log")  # catch-all
    journal.add("billing.invoice", "invoice.requested", key=lambda m: f"invoice-{m.body['order']}")
    old = order("old")
    assert inbox.process(old).outcomes == {"billing.charge": P, "audit.log": P}
    journal.calls.clear()

    a, b = order("a"), order("b")
    k1 = order("k1", **{"idempotency-key": "K"})
    k2 = order("k2", **{"idempotency-key": "K"})  # another id, the same business operation
    bad = Message.new("invoice.requested", {"ref": "bad"})  # no "order": its key= raises
    invoice = Message.new("invoice.requested", {"ref": "inv", "order": 7})
    other = Message.new("user.deleted", {"ref": "other"})  # only the catch-all takes it
    batch = [a, old, b, a, k1, k2, bad, invoice, other]

    results = inbox.process_batch(batch)

    both = ("billing.charge", "audit.log")
    assert [r.message_id for r in results] == [m.id for m in batch]  # type: ignore[union-attr]
    assert outcomes_of(results) == [
        dict.fromkeys(both, P),  # a
        dict.fromkeys(both, D),  # old: processed before the batch
        dict.fromkeys(both, P),  # b
        dict.fromkeys(both, D),  # a again, in the same batch
        dict.fromkeys(both, P),  # k1
        dict.fromkeys(both, D),  # k2: same idempotency key as k1
        InvalidKey,  # bad
        {"audit.log": P, "billing.invoice": P},  # invoice
        {"audit.log": P},  # other
    ]
    error = results[6]
    assert isinstance(error, InvalidKey)
    assert (error.handler, error.message_id) == ("billing.invoice", bad.id)
    assert "raised" in error.reason
    # Handlers ran once each, in message order, per message in registration order; nothing
    # ran for a duplicate or for the message whose key could not be derived.
    assert journal.calls == [
        ("a", "billing.charge"),
        ("a", "audit.log"),
        ("b", "billing.charge"),
        ("b", "audit.log"),
        ("k1", "billing.charge"),
        ("k1", "audit.log"),
        ("inv", "audit.log"),
        ("inv", "billing.invoice"),
        ("other", "audit.log"),
    ]
    expected_effects = {
        **{(ref, name): 1 for ref in ("old", "a", "b", "k1") for name in both},
        ("inv", "audit.log"): 1,
        ("inv", "billing.invoice"): 1,
        ("other", "audit.log"): 1,
    }
    assert db.effect_counts() == expected_effects
    expected_claims = {
        *((m.id, name) for m in (old, a, b) for name in both),
        *((key_uuid("K"), name) for name in both),
        (key_uuid("invoice-7"), "billing.invoice"),
        (invoice.id, "audit.log"),
        (other.id, "audit.log"),
    }
    assert claim_set(db) == expected_claims

    # The same batch again: every message a duplicate, the bad key still refused, no new work.
    again = inbox.process_batch(batch)
    assert [isinstance(r, InvalidKey) for r in again] == [m is bad for m in batch]
    assert all(r.outcome is D for r in again if isinstance(r, ProcessResult))
    assert len(journal.calls) == 9
    assert db.effect_counts() == expected_effects
    assert claim_set(db) == expected_claims


@pytest.mark.parametrize("on_unhandled", list(Unhandled))
def test_an_unhandled_type_in_a_batch_is_reported_at_its_place_and_the_rest_commits(
    db: Database, on_unhandled: Unhandled
) -> None:
    inbox = Inbox(db.sessions, on_unhandled=on_unhandled)
    journal = Journal(inbox)
    journal.add("billing.charge", "order.created")
    first, stray, last = order("first"), order("stray", "order.cancelled"), order("last")

    results = inbox.process_batch([first, stray, last])

    assert results[0] == ProcessResult(first.id, {"billing.charge": P})
    assert results[2] == ProcessResult(last.id, {"billing.charge": P})
    if on_unhandled is Unhandled.RAISE:
        assert isinstance(results[1], UnhandledMessage)
        assert (results[1].message_id, results[1].message_type) == (stray.id, "order.cancelled")
    else:
        assert results[1] == ProcessResult(stray.id, {})
        assert results[1].outcome is Outcome.IGNORED
    assert db.effect_counts() == {("first", "billing.charge"): 1, ("last", "billing.charge"): 1}
    assert claim_set(db) == {(first.id, "billing.charge"), (last.id, "billing.charge")}
    # A batch with nothing to run, and an empty batch, touch nothing.
    assert outcomes_of(inbox.process_batch([stray])) == [
        UnhandledMessage if on_unhandled is Unhandled.RAISE else {}
    ]
    assert inbox.process_batch([]) == []
    assert journal.calls == [("first", "billing.charge"), ("last", "billing.charge")]


def test_process_batch_refuses_anything_but_a_sequence_of_messages() -> None:
    inbox = Inbox(lambda: None)  # type: ignore[arg-type,return-value]  # never called
    message = order(1)
    for wrong in (message, iter([message]), {"m": message}.values(), [message, {"ref": 2}]):
        with pytest.raises(TypeError, match="process_batch"):
            inbox.process_batch(wrong)  # type: ignore[arg-type]


def test_handlers_run_in_message_order_and_per_message_in_registration_order(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    journal = Journal(inbox)
    # Registration order is neither alphabetical nor by type.
    journal.add("zeta.first")
    journal.add("alpha.second", "order.created")
    journal.add("mid.third")
    messages = [
        order("m0"),
        order("m1", "user.deleted"),
        order("m2"),
        order("m3", "user.deleted"),
        order("m4"),
    ]
    random.Random(7).shuffle(messages)

    inbox.process_batch(messages)

    expected = []
    for message in messages:
        names = ["zeta.first", "alpha.second", "mid.third"]
        if message.type != "order.created":
            names.remove("alpha.second")
        expected += [(ref_of(message), name) for name in names]
    assert journal.calls == expected


# --- a poison message is isolated ------------------------------------------------------------


@pytest.mark.parametrize("size", [8, 13])
def test_a_poison_message_at_any_position_fails_alone_and_every_other_commits_once(
    pg_db: Database, size: int
) -> None:
    inbox = Inbox(pg_db.sessions)
    journal = Journal(inbox)
    poison: set[str] = set()
    journal.add("ledger.post", "order.created", fails=lambda ref: ref in poison)
    journal.add("audit.log", "order.created")  # never fails
    every: list[Message] = []

    for position in range(size):
        batch = [order(f"{size}.{position}.{i}") for i in range(size)]
        every += batch
        bad = batch[position]
        poison.add(ref_of(bad))

        results = inbox.process_batch(batch)

        assert [r.message_id for r in results] == [m.id for m in batch]  # type: ignore[union-attr]
        for message, result in zip(batch, results, strict=True):
            if message is bad:
                assert isinstance(result, HandlerFailed), (position, result)
                assert list(result.failures) == ["ledger.post"]
                assert isinstance(result.failures["ledger.post"], RuntimeError)
                # The healthy handler of the poison message committed on its own.
                assert result.result.outcomes == {"audit.log": P}
            else:
                assert isinstance(result, ProcessResult), (position, message, result)
                assert result.outcomes == {"ledger.post": P, "audit.log": P}
        counts = pg_db.effect_counts()
        for message in batch:
            ref = ref_of(message)
            assert counts.get((ref, "audit.log")) == 1, (position, ref)
            assert counts.get((ref, "ledger.post")) == (None if message is bad else 1)
        claims = claim_set(pg_db)
        assert (bad.id, "ledger.post") not in claims
        assert {(m.id, n) for m in batch for n in ("ledger.post", "audit.log")} - claims == {
            (bad.id, "ledger.post")
        }

        # The redelivery runs the failed handler only, once it no longer fails.
        poison.discard(ref_of(bad))
        again = inbox.process(bad)
        assert again.outcomes == {"ledger.post": P, "audit.log": D}

    assert pg_db.effect_counts() == {
        (ref_of(m), n): 1 for m in every for n in ("ledger.post", "audit.log")
    }
    assert claim_set(pg_db) == {(m.id, n) for m in every for n in ("ledger.post", "audit.log")}


@pytest.mark.parametrize(
    "poisoned", [(0, 7), (3, 4), (1, 2, 5), tuple(range(8))], ids=["ends", "middle", "three", "all"]
)
def test_several_poison_messages_fail_alone_and_every_other_commits_once(
    db: Database, poisoned: tuple[int, ...]
) -> None:
    inbox = Inbox(db.sessions)
    journal = Journal(inbox)
    batch = [order(f"p{i}") for i in range(8)]
    poison = {f"p{i}" for i in poisoned}
    journal.add("ledger.post", "order.created", fails=lambda ref: ref in poison)
    journal.add("audit.log")

    results = inbox.process_batch(batch)

    for i, (message, result) in enumerate(zip(batch, results, strict=True)):
        assert result.message_id == message.id  # type: ignore[union-attr]
        if i in poisoned:
            assert isinstance(result, HandlerFailed)
            assert list(result.failures) == ["ledger.post"]
            assert result.result.outcomes == {"audit.log": P}
        else:
            assert isinstance(result, ProcessResult)
            assert result.outcomes == {"ledger.post": P, "audit.log": P}
    assert db.effect_counts() == {
        **{(ref_of(m), "audit.log"): 1 for m in batch},
        **{(ref_of(m), "ledger.post"): 1 for i, m in enumerate(batch) if i not in poisoned},
    }
    assert claim_set(db) == {
        *((m.id, "audit.log") for m in batch),
        *((m.id, "ledger.post") for i, m in enumerate(batch) if i not in poisoned),
    }

    # Redelivered as a batch once healed: only the failed handler runs, once per message.
    poison.clear()
    journal.calls.clear()
    healed = inbox.process_batch(batch)
    assert [r.outcomes for r in healed] == [  # type: ignore[union-attr]
        {"ledger.post": P if i in poisoned else D, "audit.log": D} for i in range(8)
    ]
    assert journal.calls == [(f"p{i}", "ledger.post") for i in poisoned]
    assert db.effect_counts() == {
        (ref_of(m), n): 1 for m in batch for n in ("ledger.post", "audit.log")
    }


def test_a_failing_message_delivered_twice_in_one_batch_fails_for_both_copies(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    journal = Journal(inbox)
    journal.add("ledger.post", fails=lambda ref: ref == "bad")
    bad, good = order("bad"), order("good")

    results = inbox.process_batch([bad, good, bad])

    assert outcomes_of(results) == [HandlerFailed, {"ledger.post": P}, HandlerFailed]
    assert db.effect_counts() == {("good", "ledger.post"): 1}
    assert claim_set(db) == {(good.id, "ledger.post")}


def test_a_batch_larger_than_one_claim_statement_page_claims_every_key_once(
    db: Database,
) -> None:
    """SQLAlchemy sends the multi-row claim in pages of 1,000 rows: the keys each page
    returns must all count, on every page."""
    inbox = Inbox(db.sessions)
    calls: Counter[str] = Counter()

    @inbox.handler(name="ledger.post")
    def post(message: Message, session: Session) -> None:
        calls[ref_of(message)] += 1

    messages = [order(i) for i in range(2300)]
    earlier = messages[::7]  # processed before, spread over every page
    assert {r.outcome for r in inbox.process_batch(earlier)} == {P}  # type: ignore[union-attr]
    calls.clear()
    batch = [*messages, *messages[1000:1010]]  # ten of them twice, the copies on page 3

    results = inbox.process_batch(batch)

    fresh = [m for m in messages if m not in earlier]
    assert [r.outcome for r in results] == [  # type: ignore[union-attr]
        *(D if m in earlier else P for m in messages),
        *[D] * 10,
    ]
    assert calls == {ref_of(m): 1 for m in fresh}
    assert claim_set(db) == {(m.id, "ledger.post") for m in messages}


# --- a handler must not end the batch's transaction ------------------------------------------


@pytest.mark.parametrize("method", ["commit", "rollback", "close"])
def test_a_handler_ending_the_transaction_in_a_batch_fails_for_its_message_only(
    db: Database, method: str
) -> None:
    inbox = Inbox(db.sessions)
    journal = Journal(inbox)
    journal.add("audit.log")

    @inbox.handler("order.created", name="rogue")
    def rogue(message: Message, session: Session) -> None:
        record_effect(message, session, "rogue")
        if ref_of(message) == "r2":
            getattr(session, method)()

    batch = [order(f"r{i}") for i in range(5)]

    results = inbox.process_batch(batch)

    failed = results[2]
    assert isinstance(failed, HandlerFailed)
    assert list(failed.failures) == ["rogue"]
    assert isinstance(failed.failures["rogue"], TransactionControlError)
    assert f"session.{method}()" in str(failed.failures["rogue"])
    assert failed.result.outcomes == {"audit.log": P}
    for i in (0, 1, 3, 4):
        assert results[i] == ProcessResult(batch[i].id, {"audit.log": P, "rogue": P})
    assert db.effect_counts() == {
        **{(f"r{i}", "audit.log"): 1 for i in range(5)},
        **{(f"r{i}", "rogue"): 1 for i in (0, 1, 3, 4)},
    }
    assert (batch[2].id, "rogue") not in claim_set(db)


def test_a_handler_committing_behind_the_guards_in_a_batch_loses_no_other_message(
    db: Database,
) -> None:
    """The batch claims every message before the first handler runs. A handler that commits
    the session's transaction behind the guards (as process() reports with a
    TransactionControlError) must not commit the claims of the messages after it without
    their handlers' effects: those messages would then be duplicates for ever, their
    effects never committed."""
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="sneaky")
    def sneaky(message: Message, session: Session) -> None:
        record_effect(message, session, "sneaky")
        if ref_of(message) == "s1":
            transaction = session.get_transaction()
            assert transaction is not None
            transaction.commit()

    batch = [order(f"s{i}") for i in range(4)]

    results = inbox.process_batch(batch)

    counts = db.effect_counts()
    for ref in ("s0", "s2", "s3"):
        assert counts.get((ref, "sneaky")) == 1, f"{ref}: {counts}, {outcomes_of(results)}"
    assert isinstance(results[1], HandlerFailed), outcomes_of(results)
    assert isinstance(results[1].failures["sneaky"], TransactionControlError)


# --- transient errors: the whole batch again, never bisected ---------------------------------


def fail_transiently(session: Session, backend: str, how: str) -> None:
    """Have the database itself abort the handler's transaction."""
    if how == "lost-connection":
        assert backend == "postgresql"
        session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
    elif backend == "postgresql":
        sqlstate = {"serialization": "40001", "deadlock": "40P01"}[how]
        session.execute(
            text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$")
        )
    else:  # MariaDB: the server reports the error number the inbox reads (1213: deadlock)
        errno = {"serialization": 1020, "deadlock": 1213}[how]
        session.execute(
            text(f"SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = 'injected'")
        )


TRANSIENT_CASES = [
    ("postgresql", "serialization"),
    ("postgresql", "deadlock"),
    ("postgresql", "lost-connection"),
    ("mariadb", "serialization"),
    ("mariadb", "deadlock"),
]


@pytest.mark.parametrize(
    ("backend", "how"), TRANSIENT_CASES, ids=["-".join(c) for c in TRANSIENT_CASES]
)
def test_a_transient_error_is_retried_as_the_whole_batch_which_then_commits_once(
    request: pytest.FixtureRequest, backend: str, how: str
) -> None:
    server_db: Database = request.getfixturevalue(
        {"postgresql": "pg_db", "mariadb": "mariadb_db"}[backend]
    )
    sessions = server_db.sessions
    commits = count_commits(sessions)
    inbox = Inbox(sessions, transient_retries=3)
    journal = Journal(inbox)
    journal.add("audit.log")
    tripped: list[str] = []

    @inbox.handler("order.created", name="ledger.post")
    def post(message: Message, session: Session) -> None:
        record_effect(message, session, "ledger.post")
        if ref_of(message) == "t2" and not tripped:
            tripped.append(how)
            fail_transiently(session, backend, how)

    batch = [order(f"t{i}") for i in range(6)]

    results = inbox.process_batch(batch)

    assert tripped == [how]
    assert [r.outcomes for r in results] == [{"audit.log": P, "ledger.post": P}] * 6  # type: ignore[union-attr]
    # Two attempts of the whole batch (t0..t2, then all six), and ONE commit: a bisect
    # would have committed the halves separately.
    assert journal.calls == [(f"t{i}", "audit.log") for i in (0, 1, 2, 0, 1, 2, 3, 4, 5)]
    assert commits == [1]
    assert server_db.effect_counts() == {
        (f"t{i}", name): 1 for i in range(6) for name in ("audit.log", "ledger.post")
    }


def test_a_busy_sqlite_file_is_retried_as_the_whole_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "busy.db"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    inbox_metadata.create_all(engine)
    effects_metadata.create_all(engine)
    sessions = sessionmaker(engine)
    commits = count_commits(sessions)
    inbox = Inbox(sessions, transient_retries=8)
    journal = Journal(inbox)
    journal.add("ledger.post")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")  # holds the write lock: the claim insert gets SQLITE_BUSY
    releaser = threading.Timer(0.3, writer.execute, args=("COMMIT",))
    caplog.set_level(logging.INFO, logger="inbox")
    releaser.start()
    batch = [order(f"b{i}") for i in range(5)]
    try:
        results = inbox.process_batch(batch)
    finally:
        releaser.join()
        writer.close()
        engine.dispose()
    assert [r.outcomes for r in results] == [{"ledger.post": P}] * 5  # type: ignore[union-attr]
    assert journal.calls == [(f"b{i}", "ledger.post") for i in range(5)]
    assert commits == [1]
    assert any(
        "batch of 5 messages: transient database error" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("how", ["serialization", "deadlock"])
def test_a_transient_error_that_never_stops_sends_the_batch_one_by_one_and_only_its_message_fails(
    server_db: Database, how: str
) -> None:
    sessions = server_db.sessions
    inbox = Inbox(sessions, transient_retries=2)
    journal = Journal(inbox)
    journal.add("audit.log")
    attempts: Counter[str] = Counter()

    @inbox.handler("order.created", name="ledger.post")
    def post(message: Message, session: Session) -> None:
        attempts[ref_of(message)] += 1
        record_effect(message, session, "ledger.post")
        if ref_of(message) == "n3":
            fail_transiently(session, server_db.backend, how)

    batch = [order(f"n{i}") for i in range(6)]

    results = inbox.process_batch(batch)

    for message, result in zip(batch, results, strict=True):
        if ref_of(message) != "n3":
            assert isinstance(result, ProcessResult), result
            assert result.outcomes == {"audit.log": P, "ledger.post": P}
            continue
        assert isinstance(result, HandlerFailed), result
        assert set(result.failures) == {"ledger.post"}
        assert isinstance(result.failures["ledger.post"], DBAPIError)
        assert result.result.outcomes == {"audit.log": P}
    # transient_retries + 1 attempts of the whole batch, each stopping at n3; no bisect
    # (halves would run n0..n2 more often); then each message alone, n3 with its own retries.
    assert attempts == Counter({"n0": 4, "n1": 4, "n2": 4, "n3": 6, "n4": 1, "n5": 1})
    expected = {(f"n{i}", "ledger.post"): 1 for i in range(6) if i != 3}
    expected |= {(f"n{i}", "audit.log"): 1 for i in range(6)}
    assert server_db.effect_counts() == expected
    assert len(claim_set(server_db)) == len(expected)


# --- concurrent batches over the same messages -----------------------------------------------


def test_four_threads_batching_the_same_messages_in_different_orders_commit_each_once(
    server_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    threads, messages_count, batch_size = 4, 400, 40
    engine = create_engine(server_db.url, pool_size=threads, max_overflow=0)
    inbox = Inbox(sessionmaker(engine))
    journal = Journal(inbox)
    journal.add("ledger.post", "order.created")
    journal.add("audit.log")
    messages = [order(i) for i in range(messages_count)]
    start = threading.Barrier(threads)

    def deliver(seed: int) -> list[ProcessResult | InboxError]:
        mine = list(messages)
        random.Random(seed).shuffle(mine)
        start.wait(10)
        results: list[ProcessResult | InboxError] = []
        for i in range(0, messages_count, batch_size):
            results += inbox.process_batch(mine[i : i + batch_size])
        return results

    caplog.set_level(logging.INFO, logger="inbox")
    try:
        with ThreadPoolExecutor(threads) as pool:
            per_thread = [
                f.result(timeout=120) for f in [pool.submit(deliver, s) for s in range(threads)]
            ]
    finally:
        engine.dispose()

    every = [r for results in per_thread for r in results]
    errors = [r for r in every if not isinstance(r, ProcessResult)]
    assert errors == []
    processed = Counter(name for r in every for name in r.processed)  # type: ignore[union-attr]
    assert processed == {"ledger.post": messages_count, "audit.log": messages_count}
    assert sum(r.outcome is P for r in every) == messages_count  # type: ignore[union-attr]
    assert server_db.effect_counts() == {
        (str(i), name): 1 for i in range(messages_count) for name in ("ledger.post", "audit.log")
    }
    # Every batch takes its claims in one order (handler, then key): no deadlock, so not even
    # a retried one. (Claimed in another order, PostgreSQL deadlocks here within seconds.)
    retried = [r.getMessage() for r in caplog.records if "transient" in r.getMessage()]
    assert retried == []


# --- the PostgreSQL claim's pre-rendered SQL and schema_translate_map ------------------------


@pytest.fixture
def translated_schema(pg_db: Database, admin_engines: dict[str, Engine]) -> Iterator[str]:
    """A second schema with its own inbox and effects tables, outside the search path."""
    schema = f"alt_{uuid.uuid4().hex[:12]}"
    with admin_engines["postgresql"].connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    translated = pg_db.engine.execution_options(schema_translate_map={None: schema})
    inbox_metadata.create_all(translated)
    effects_metadata.create_all(translated)
    try:
        yield schema
    finally:
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def test_postgresql_claims_follow_schema_translate_map_one_by_one_and_in_batches(
    pg_db: Database, translated_schema: str
) -> None:
    translated = pg_db.engine.execution_options(schema_translate_map={None: translated_schema})
    inbox = Inbox(sessionmaker(translated))
    journal = Journal(inbox)
    journal.add("ledger.post")
    one, two, three = order("one"), order("two"), order("three")

    assert inbox.process(one).outcome is P
    assert inbox.process(one).outcome is D
    assert [r.outcome for r in inbox.process_batch([two, one, three, two])] == [P, D, P, D]  # type: ignore[union-attr]

    # Everything went to the translated schema, nothing to the one on the search path.
    assert claim_set(pg_db) == set()
    assert pg_db.effect_counts() == {}
    alt = inbox_table(MetaData(), schema=translated_schema)
    with pg_db.engine.connect() as connection:
        stored = set(connection.execute(select(alt.c.message_id, alt.c.handler)))
        refs = Counter(
            connection.execute(text(f"SELECT ref FROM {translated_schema}.effects")).scalars()
        )
    assert stored == {(m.id, "ledger.post") for m in (one, two, three)}
    assert refs == {"one": 1, "two": 1, "three": 1}
