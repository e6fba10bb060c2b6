"""Cleanup beside live workers on real PostgreSQL: 50,000 expired claims are deleted in short
batches while four threads process new messages and redeliveries, and while a second cleanup
runs at the same time.

What must hold: every new message commits its effect exactly once; a redelivery whose claim is
inside the retention window stays a duplicate (its claim is never deleted, not even one ten
minutes from the cutoff); every expired claim is deleted, exactly once; and no worker waits
for the cleanup longer than about one batch, because each batch commits (and releases its row
locks) on its own.

PostgreSQL deletes 50,000 rows in about a tenth of a second, far too fast for a timing claim
to mean anything on a noisy machine. So the test schema gets an AFTER DELETE statement trigger
that sleeps 50 microseconds per deleted row, inside the deleting transaction, with that
batch's row locks held: a batch of 1,000 holds its locks for at least 50 ms, and the whole
run for at least 2.5 s. That models a large, cold table where deleting costs time per row,
and it makes "one batch" and "the whole run" differ by a factor of 50.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Engine, create_engine, event, func, insert, select, text, tuple_
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects

from inbox import CleanupReport, Inbox, Message, Outcome, cleanup
from inbox.schema import inbox_message

OLD_CLAIMS = 50_000
BATCH = 1_000
DAYS = 30
HANDLER = "load.apply"
WORKERS = 4
# Seconds the trigger sleeps per deleted row: a batch of BATCH rows holds its locks >= 50 ms.
SECONDS_PER_DELETED_ROW = 0.000_05
# Scheduling noise a worker call may show on a loaded 2-core machine (four worker threads and
# a cleanup thread sharing one GIL, PostgreSQL's fsync on every commit), on top of one batch.
SLACK = 1.0
DEADLINE = 60.0  # a hung test fails instead of hanging


@dataclass
class BatchClock:
    """Wall-clock spans of every transaction an engine ran: one per cleanup batch."""

    spans: list[tuple[float, float]] = field(default_factory=list)
    _started: float | None = None

    def attach(self, engine: Engine) -> None:
        # begin: the batch's transaction starts; checkin: the connection is back in the pool,
        # i.e. after COMMIT returned and the batch's row locks are released.
        event.listen(engine, "begin", self._begin)
        event.listen(engine.pool, "checkin", self._checkin)

    def _begin(self, connection: object) -> None:
        self._started = time.perf_counter()

    def _checkin(self, dbapi_connection: object, record: object) -> None:
        if self._started is not None:
            self.spans.append((self._started, time.perf_counter()))
            self._started = None

    @property
    def longest(self) -> float:
        return max(end - start for start, end in self.spans)


@pytest.fixture
def slow_deletes(pg_db: Database) -> Database:
    """pg_db with the per-row delete cost described in the module docstring (dropped with
    the test's schema)."""
    with pg_db.engine.begin() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION inbox_slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN PERFORM pg_sleep((SELECT count(*) FROM gone) * "
                f"{SECONDS_PER_DELETED_ROW!r}); RETURN NULL; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER inbox_slow_delete AFTER DELETE ON inbox_message "
                "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
                "EXECUTE FUNCTION inbox_slow_delete()"
            )
        )
    return pg_db


def prefill_old_claims(db: Database, count: int) -> None:
    """``count`` claims of HANDLER processed 40 days (and up to 14 hours more) ago, written by
    the server in one statement."""
    with db.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO inbox_message (message_id, handler, processed_at) "
                "SELECT uuid_send(gen_random_uuid()), :handler, "
                "now() - interval '40 days' - g * interval '1 second' "
                "FROM generate_series(1, :count) AS g"
            ),
            {"handler": HANDLER, "count": count},
        )
        connection.execute(text("ANALYZE inbox_message"))


def insert_claims(db: Database, ids: list[uuid.UUID], processed_at: dt.datetime) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [{"message_id": i, "handler": HANDLER, "processed_at": processed_at} for i in ids],
        )


def expired_count(db: Database) -> int:
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=DAYS)
    with db.engine.connect() as connection:
        query = select(func.count()).where(inbox_message.c.processed_at < cutoff)
        return int(connection.execute(query).scalar_one())


def claims_present(db: Database, ids: list[uuid.UUID]) -> int:
    with db.engine.connect() as connection:
        keys = [(i, HANDLER) for i in ids]
        query = select(func.count()).where(
            tuple_(inbox_message.c.message_id, inbox_message.c.handler).in_(keys)
        )
        return int(connection.execute(query).scalar_one())


def effect_refs(db: Database) -> Counter[str]:
    with db.engine.connect() as connection:
        return Counter(connection.execute(select(effects.c.ref)).scalars())


def load_message(ref: str, message_id: uuid.UUID | None = None) -> Message:
    return Message(message_id or uuid.uuid4(), "load", {"ref": ref})


@dataclass
class Call:
    ref: str
    outcome: Outcome
    started: float
    seconds: float


def test_cleanup_beside_four_busy_workers_deletes_every_expired_claim_and_only_those(
    slow_deletes: Database,
) -> None:
    db = slow_deletes
    prefill_old_claims(db, OLD_CLAIMS)
    rng = random.Random(20261126)
    with db.engine.connect() as connection:
        sampled = connection.execute(
            select(inbox_message.c.message_id).order_by(func.random()).limit(1_500)
        )
        old_ids: list[uuid.UUID] = list(sampled.scalars())

    engine = create_engine(db.url, pool_size=WORKERS + 1, max_overflow=0)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("load", name=HANDLER)
    def apply(message: Message, session: Session) -> None:
        session.execute(insert(effects).values(ref=message.body["ref"], handler=HANDLER))

    # Recent claims, inside the window: processed just now, 29 days ago, and ten minutes
    # short of the cutoff. Their redeliveries must stay duplicates throughout.
    recent = [load_message(f"recent-{i}") for i in range(200)]
    for message in recent:
        assert inbox.process(message).outcome is Outcome.PROCESSED
    now = dt.datetime.now(dt.UTC)
    aged = [load_message(f"aged-{i}") for i in range(200)]
    insert_claims(db, [m.id for m in aged], now - dt.timedelta(days=29))
    edge = [load_message(f"edge-{i}") for i in range(50)]
    insert_claims(db, [m.id for m in edge], now - dt.timedelta(days=DAYS, minutes=-10))
    inside_window = [*recent, *aged, *edge]

    # New messages, each delivered by two different workers; redeliveries of recent claims;
    # and redeliveries of expired claims (sampled across the whole table), which collide with
    # the rows the cleanup is deleting: such a claim waits for that one batch to commit, then
    # finds the row gone and runs (the retention rule), or finds it still there: a duplicate.
    fresh = [load_message(f"new-{i}") for i in range(400)]
    expired = [load_message(f"old-{i.hex}", i) for i in old_ids]
    plans: list[list[Message]] = [[] for _ in range(WORKERS)]
    for i, message in enumerate(fresh):
        plans[i % WORKERS].append(message)
        plans[(i + 1) % WORKERS].append(message)
    for i, message in enumerate([*recent, *recent, *aged, *edge, *expired]):
        plans[i % WORKERS].append(message)
    for plan in plans:
        rng.shuffle(plan)

    calls: list[Call] = []
    extra: list[Message] = []
    reports: list[CleanupReport] = []
    errors: list[BaseException] = []
    clock = BatchClock()
    cleanup_engine = create_engine(db.url, pool_size=1, max_overflow=0)
    clock.attach(cleanup_engine)
    start = threading.Barrier(WORKERS + 1)
    deleting_done = threading.Event()
    workers_done = threading.Event()

    def work(plan: list[Message], number: int) -> None:
        more = itertools.count()
        try:
            start.wait()
            deadline = time.monotonic() + DEADLINE
            queue: Iterator[Message] = iter(plan)
            while time.monotonic() < deadline:
                message = next(queue, None)
                if message is None:
                    if deleting_done.is_set():
                        return
                    # Keep the load on until the cleanup has deleted everything expired.
                    message = load_message(f"extra-{number}-{next(more)}")
                    extra.append(message)
                began = time.perf_counter()
                outcome = inbox.process(message).outcome
                calls.append(Call(message.body["ref"], outcome, began, time.perf_counter() - began))
        except BaseException as exc:
            errors.append(exc)

    def clean() -> None:
        try:
            start.wait()
            while not workers_done.is_set():
                reports.append(cleanup(cleanup_engine, days=DAYS, batch_size=BATCH))
                deleting_done.set()
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)
            deleting_done.set()

    cleaner = threading.Thread(target=clean)
    workers = [threading.Thread(target=work, args=(plan, n)) for n, plan in enumerate(plans)]
    try:
        cleaner.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(DEADLINE + 10)
        workers_done.set()
        cleaner.join(DEADLINE + 10)
    finally:
        workers_done.set()
        engine.dispose()
        cleanup_engine.dispose()
    assert not errors, errors
    assert not cleaner.is_alive()
    assert not any(w.is_alive() for w in workers)

    # Every expired claim deleted, each exactly once, in short batches; none inside the window.
    assert sum(r.deleted for r in reports) == OLD_CLAIMS
    assert reports[0].deleted == OLD_CLAIMS
    assert reports[0].batches == OLD_CLAIMS // BATCH + 1
    assert expired_count(db) == 0
    assert claims_present(db, [m.id for m in inside_window]) == len(inside_window)

    # Exactly once: each new message ran once (and its second delivery was a duplicate); every
    # redelivery inside the window was a duplicate and changed nothing; an expired claim's
    # redelivery ran at most once (once if its claim was already deleted).
    outcomes: dict[str, Counter[Outcome]] = {}
    for call in calls:
        outcomes.setdefault(call.ref, Counter())[call.outcome] += 1
    refs = effect_refs(db)
    expectations: list[tuple[list[Message], dict[Outcome, int], int]] = [
        (fresh, {Outcome.PROCESSED: 1, Outcome.DUPLICATE: 1}, 1),
        (extra, {Outcome.PROCESSED: 1}, 1),
        (recent, {Outcome.DUPLICATE: 2}, 1),
        ([*aged, *edge], {Outcome.DUPLICATE: 1}, 0),
    ]
    for messages, expected_outcomes, expected_effects in expectations:
        for message in messages:
            ref = message.body["ref"]
            assert (outcomes[ref], refs[ref]) == (expected_outcomes, expected_effects), ref
    for message in expired:
        ref = message.body["ref"]
        assert sum(outcomes[ref].values()) == 1
        assert refs[ref] == outcomes[ref][Outcome.PROCESSED]
    assert max(refs.values()) == 1
    # The load overlapped the deleting: some expired claims were still there when redelivered
    # (duplicates), others already deleted (run again, as the retention rule says).
    ran_again = sum(outcomes[m.body["ref"]][Outcome.PROCESSED] for m in expired)
    assert 0 < ran_again < len(expired)

    # No worker waited for the cleanup longer than about one batch. A claim that collides
    # with a row in the batch being deleted waits for that batch's transaction to commit —
    # the longest batch measured below — never for the whole run, because each batch commits
    # on its own. SLACK absorbs scheduling noise. The first assertion checks the bound means
    # something: the deleting run held row locks for >= 2.5 s (trigger), so a cleanup that
    # held its locks across batches would show one "batch" as long as the run and fail it,
    # and a worker made to wait for the run would exceed the bound and fail the second.
    deleting = clock.spans[: reports[0].batches]
    run_seconds = deleting[-1][1] - deleting[0][0]
    longest_batch = max(end - start for start, end in deleting)
    assert run_seconds >= OLD_CLAIMS * SECONDS_PER_DELETED_ROW
    assert longest_batch + SLACK < run_seconds, (longest_batch, run_seconds)
    during = [c for c in calls if deleting[0][0] <= c.started <= deleting[-1][1]]
    assert len(during) >= 100, "the workers must have been busy while the cleanup deleted"
    slowest = max(c.seconds for c in calls)
    assert slowest < longest_batch + SLACK, (slowest, longest_batch)


def test_two_concurrent_cleanups_delete_each_expired_claim_exactly_once(
    slow_deletes: Database,
) -> None:
    db = slow_deletes
    prefill_old_claims(db, OLD_CLAIMS)
    kept = [uuid.uuid4() for _ in range(100)]
    insert_claims(db, kept, dt.datetime.now(dt.UTC) - dt.timedelta(days=DAYS - 1))
    engines = [create_engine(db.url, pool_size=1, max_overflow=0) for _ in range(2)]
    clocks = [BatchClock() for _ in engines]
    for clock, engine in zip(clocks, engines, strict=True):
        clock.attach(engine)
    start = threading.Barrier(2)
    reports: list[CleanupReport | None] = [None, None]
    errors: list[BaseException] = []

    def clean(number: int) -> None:
        try:
            start.wait()
            reports[number] = cleanup(engines[number], days=DAYS, batch_size=BATCH)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=clean, args=(n,)) for n in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    finally:
        for engine in engines:
            engine.dispose()

    assert not errors, errors
    first, second = reports
    assert first is not None
    assert second is not None
    # Together they deleted each expired row once: the counts add up, nothing expired is
    # left, nothing inside the window is gone.
    assert first.deleted + second.deleted == OLD_CLAIMS
    assert expired_count(db) == 0
    assert claims_present(db, kept) == len(kept)
    # They ran side by side, neither waiting for the other's batches (SKIP LOCKED: each takes
    # rows the other has not locked): both deleted, and together they took well under the
    # time the batches need one after another — the trigger alone sleeps 2.5 s in total. A
    # cleanup that waited on the other's locked rows instead serializes the batches (about
    # 2.8 s here, measured) and fails the last assertion.
    assert first.deleted >= BATCH
    assert second.deleted >= BATCH
    spans = [span for clock in clocks for span in clock.spans]
    together = max(end for _, end in spans) - min(start for start, _ in spans)
    one_after_another = OLD_CLAIMS * SECONDS_PER_DELETED_ROW
    assert together < 0.8 * one_after_another, (together, one_after_another)
