"""How cleanup sizes and runs its batches: the time budget (adaptive batch size), and on real
PostgreSQL the walker (oldest first, no row locks before the delete, behind an advisory
lock) and the helper (newest first, FOR UPDATE SKIP LOCKED) with their keyset cursors —
at the cutoff, over ties at batch edges, beside concurrent inserts and uncommitted claims."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, Row, create_engine, delete, func, insert, select, text
from support.databases import Database

from inbox import cleanup
from inbox.retention import _batches, _key_batches
from inbox.retention._effect_records import effect_sizing
from inbox.retention._key_batches import delete_by_keys
from inbox.retention._pg_walk import _LOCK_SPACE, _oid_key
from inbox.retention._sizing import (
    FIRST_ADAPTIVE_BATCH,
    MAX_ADAPTIVE_BATCH,
    MIN_ADAPTIVE_BATCH,
    BatchSizing,
)
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_message

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
DAYS = 30
CUTOFF = NOW - dt.timedelta(days=DAYS)
TICK = dt.timedelta(microseconds=1)


# -- the time budget ------------------------------------------------------------------------


def test_a_fixed_size_never_changes() -> None:
    sizing = BatchSizing(fixed=3)
    for rows, seconds in [(3, 10.0), (3, 0.000_001), (0, 1.0)]:
        sizing.record(rows, seconds)
        assert sizing.size == 3


def test_the_adaptive_size_starts_small_and_grows_at_most_twofold_per_batch() -> None:
    sizing = BatchSizing(seconds=0.05)
    assert sizing.size == FIRST_ADAPTIVE_BATCH
    sizes = []
    for _ in range(12):
        rows = sizing.size
        sizing.record(rows, rows * 0.000_000_1)  # 0.1 µs a row: the budget allows 500,000
        sizes.append(sizing.size)
    assert sizes[0] == 2 * FIRST_ADAPTIVE_BATCH
    assert all(b <= 2 * a for a, b in itertools.pairwise(sizes))
    assert sizes[-1] == MAX_ADAPTIVE_BATCH


def test_the_adaptive_size_settles_on_the_budget() -> None:
    sizing = BatchSizing(seconds=0.05)
    for _ in range(30):
        sizing.record(sizing.size, sizing.size * 0.000_002)  # 2 µs a row: 25,000 fit
    assert sizing.size == 25_000


def test_a_slow_batch_shrinks_the_next_at_once() -> None:
    sizing = BatchSizing(seconds=0.05)
    for _ in range(10):
        sizing.record(sizing.size, sizing.size * 0.000_002)
    assert sizing.size == 25_000
    sizing.record(25_000, 0.5)  # ten times the budget (a stall)
    assert sizing.size < 5_000
    sizing.record(sizing.size, 1000.0)
    assert sizing.size == MIN_ADAPTIVE_BATCH


def test_the_adaptive_size_keeps_two_significant_digits_and_its_bound() -> None:
    sizing = BatchSizing(seconds=0.05, most=10_000)
    sizing.record(2_000, 2_000 * 0.000_037)
    assert sizing.size == 1_300  # 0.05 / 37 µs = 1,351
    for _ in range(20):
        sizing.record(sizing.size, 0.000_001)
    assert sizing.size == 10_000
    assert BatchSizing(fixed=50_000, most=10_000).size == 10_000


def test_a_pause_waits_between_batches_not_after_the_last(db: Database) -> None:
    fill(db.engine, [dt.timedelta(days=90, seconds=i) for i in range(9)])
    report = cleanup(db.engine, days=DAYS, now=NOW, batch_size=4, pause_seconds=0.2)

    assert (report.deleted, report.batches) == (9, 3)
    assert report.seconds >= 0.4  # two pauses: none after the last batch
    assert report.longest_batch_seconds < 0.2  # and none inside a batch


@pytest.mark.parametrize(
    ("rows", "expected", "pauses"), [(9, (9, 3), 2), (8, (8, 2), 2), (0, (0, 0), 0)]
)
def test_the_key_batch_loop_pauses_between_batches_and_an_empty_look_is_no_batch(
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
    rows: int,
    expected: tuple[int, int],
    pauses: int,
) -> None:
    """The loop effect records and task results share: batches of 4, a pause after each
    full one (a short batch is the last: no pause after it), and the look that finds
    nothing left is no batch."""
    if rows:
        fill(db.engine, [dt.timedelta(days=90, seconds=i) for i in range(rows)])
    slept: list[float] = []
    monkeypatch.setattr(_key_batches.time, "sleep", slept.append)
    key = inbox_message.c.message_id

    def delete_keys(connection: Connection, found: Sequence[Row[Any]]) -> None:
        connection.execute(delete(inbox_message).where(key.in_([row[0] for row in found])))

    sizing = BatchSizing(fixed=4, pause=0.2)
    deleted, batches, _ = delete_by_keys(
        db.engine, lambda limit: select(key).order_by(key).limit(limit), delete_keys, sizing
    )

    assert (deleted, batches) == expected
    assert slept == [0.2] * pauses
    assert effect_sizing(None, 0.025, 0.1).pause == 0.1  # effects and results pause too


def test_the_pause_follows_the_measured_batch_time() -> None:
    """``pause_ratio``: the pause after a batch is that multiple of the batch's own time, so
    slow batches (a loaded server) get long pauses; ``pause`` is the floor."""
    sizing = BatchSizing(seconds=0.05, pause_ratio=2.0)
    assert sizing.next_pause == 0.0  # nothing measured yet
    sizing.record(2_000, 0.010)
    assert sizing.next_pause == pytest.approx(0.020)
    before = sizing.size
    sizing.record(before, 0.080)  # a slow batch: a long pause, and a smaller batch
    assert sizing.next_pause == pytest.approx(0.160)
    assert sizing.size < before
    fixed = BatchSizing(fixed=10, pause=0.05, pause_ratio=1.0)  # fixed sizes are paced too
    fixed.record(10, 0.010)
    assert fixed.next_pause == 0.05
    fixed.record(10, 0.200)
    assert fixed.next_pause == pytest.approx(0.200)
    assert effect_sizing(None, 0.025, 0.0, 3.0).pause_ratio == 3.0  # effects and results too


def test_the_key_batch_loop_pauses_longer_after_a_slower_batch(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch slowed for real (its transaction held open 10 ms, then 100 ms) is followed by
    a pause of ``pause_ratio`` times its measured time."""
    fill(db.engine, [dt.timedelta(days=90, seconds=i) for i in range(9)])
    slept: list[float] = []
    monkeypatch.setattr(_key_batches.time, "sleep", slept.append)
    key = inbox_message.c.message_id
    stalls = iter([0.010, 0.100, 0.0])

    def delete_keys(connection: Connection, found: Sequence[Row[Any]]) -> None:
        connection.execute(delete(inbox_message).where(key.in_([row[0] for row in found])))
        threading.Event().wait(next(stalls))  # the batch's transaction takes longer

    sizing = BatchSizing(fixed=4, pause_ratio=1.5)
    deleted, batches, longest = delete_by_keys(
        db.engine, lambda limit: select(key).order_by(key).limit(limit), delete_keys, sizing
    )

    assert (deleted, batches) == (9, 3)
    assert len(slept) == 2  # none after the last batch
    assert 0.015 <= slept[0] < 0.1  # 1.5 x (10 ms + the batch's statements)
    assert 0.150 <= slept[1] <= 1.5 * longest


def test_cleanup_paces_the_claims_batches_by_their_time(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(db.engine, [dt.timedelta(days=90, seconds=i) for i in range(9)])
    slept: list[float] = []
    monkeypatch.setattr(_batches.time, "sleep", slept.append)

    report = cleanup(db.engine, days=DAYS, now=NOW, batch_size=4, pause_ratio=2.0)

    assert (report.deleted, report.batches) == (9, 3)
    assert len(slept) == 2
    assert all(0 < pause <= 2.0 * report.longest_batch_seconds for pause in slept)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"pause_seconds": -0.1}, ValueError, "pause_seconds"),
        ({"pause_seconds": float("inf")}, ValueError, "pause_seconds"),
        ({"pause_seconds": None}, TypeError, "pause_seconds"),
        ({"batch_seconds": 0}, ValueError, "batch_seconds"),
        ({"batch_seconds": -1.0}, ValueError, "batch_seconds"),
        ({"batch_seconds": float("nan")}, ValueError, "batch_seconds"),
        ({"batch_seconds": 61}, ValueError, "batch_seconds"),
        ({"batch_seconds": "0.05"}, TypeError, "batch_seconds"),
        ({"batch_seconds": True}, TypeError, "batch_seconds"),
        ({"batch_size": 1.5}, TypeError, "batch_size"),
        ({"pause_ratio": -1}, ValueError, "pause_ratio"),
        ({"pause_ratio": 101}, ValueError, "pause_ratio"),
        ({"pause_ratio": float("nan")}, ValueError, "pause_ratio"),
        ({"pause_ratio": "2"}, TypeError, "pause_ratio"),
    ],
)
def test_bad_batching_arguments_are_refused_before_touching_the_database(
    kwargs: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        cleanup("sqlite://", days=30, **kwargs)  # type: ignore[arg-type]


# -- every backend --------------------------------------------------------------------------


def fill(engine: Engine | Connection, ages: list[dt.timedelta], handler: str = "h") -> None:
    rows = [
        {"message_id": uuid.uuid4(), "handler": handler, "processed_at": NOW - age} for age in ages
    ]
    if isinstance(engine, Connection):
        engine.execute(insert(inbox_message), rows)
        return
    with engine.begin() as connection:
        connection.execute(insert(inbox_message), rows)


def ages_left(engine: Engine) -> list[dt.timedelta]:
    with engine.connect() as connection:
        times = connection.execute(select(inbox_message.c.processed_at)).scalars()
        return sorted(NOW - at for at in times)


def test_adaptive_batches_delete_every_expired_claim_and_keep_the_cutoff(db: Database) -> None:
    expired = [dt.timedelta(days=DAYS + 1, seconds=i) for i in range(2_500)]
    kept = [dt.timedelta(days=DAYS), dt.timedelta(days=DAYS) - TICK, dt.timedelta(0)]
    fill(db.engine, [*expired, dt.timedelta(days=DAYS) + TICK, *kept])

    report = cleanup(db.engine, days=DAYS, now=NOW, batch_seconds=0.001)

    assert report.deleted == 2_501
    assert report.batches >= 2  # 2,000 rows first, then sized to the 1 ms budget
    assert ages_left(db.engine) == sorted(kept)


def test_the_cli_takes_a_time_budget(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [
                {"message_id": uuid.uuid4(), "handler": "h", "processed_at": at}
                for at in [NOW.replace(year=2020)] * 5 + [dt.datetime.now(dt.UTC)]
            ],
        )
    out, err = io.StringIO(), io.StringIO()
    argv = ["--days", "30", "--batch-ms", "20", "--pause-ms", "5", "--pause-percent", "150"]
    argv += ["--database-url", db.url]

    assert cleanup_main(argv, stdout=out, stderr=err) == 0, err.getvalue()

    assert "deleted 5 claims" in out.getvalue()
    for flag, bad in [
        *[("--batch-ms", bad) for bad in ("0", "60001", "1.5", "x")],
        *[("--pause-ms", bad) for bad in ("-1", "60001", "0.5")],
        *[("--pause-percent", bad) for bad in ("-1", "10001", "1.5")],
    ]:
        code = cleanup_main(["--days", "30", flag, bad, "--database-url", db.url], stderr=err)
        assert code == 2, (flag, bad)


# -- PostgreSQL: the walker and the helper --------------------------------------------------


@contextmanager
def batch_counts() -> Iterator[list[int]]:
    """The rows of each claim batch, from the ``inbox.retention`` log records."""
    counts: list[int] = []

    class Counts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            deleted = getattr(record, "inbox_deleted", None)
            if isinstance(deleted, int):
                counts.append(deleted)

    logger = logging.getLogger("inbox.retention")
    handler, level = Counts(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield counts
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def walker_lock_held(db: Database) -> Iterator[None]:
    """Hold the walker's advisory lock of ``db``'s inbox table from another session, as a
    running cleanup would: a cleanup started meanwhile is a helper."""
    engine = create_engine(db.url, pool_size=1)
    try:
        with engine.connect() as connection:
            with connection.begin():
                key = _oid_key(connection, inbox_message)
                connection.execute(select(func.pg_advisory_lock(_LOCK_SPACE, key)))
            yield
            with connection.begin():
                connection.execute(select(func.pg_advisory_unlock(_LOCK_SPACE, key)))
    finally:
        engine.dispose()


def advisory_locks(db: Database) -> int:
    with db.engine.connect() as connection:
        query = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        return int(connection.execute(query).scalar_one())


@pytest.fixture(params=["walker", "helper"])
def role(request: pytest.FixtureRequest, pg_db: Database) -> Iterator[str]:
    """Run the test's cleanups as the walker, or as a helper (the walker's lock taken)."""
    if request.param == "walker":
        yield "walker"
    else:
        with walker_lock_held(pg_db):
            yield "helper"


def test_pg_the_cutoff_is_exact_across_batch_edges_and_ties(pg_db: Database, role: str) -> None:
    # Claims of one batch transaction share their processed_at: ties of 7 across every edge
    # of batches of 5, 23 at one instant, and the last ones a microsecond either side of the
    # cutoff.
    expired: list[dt.timedelta] = []
    for group in range(6):
        expired += [dt.timedelta(days=DAYS + 1, seconds=group)] * 7
    expired += [dt.timedelta(days=DAYS + 2)] * 23  # more than four batches of one instant
    expired += [dt.timedelta(days=DAYS) + TICK] * 3
    kept = [dt.timedelta(days=DAYS)] * 4 + [dt.timedelta(days=DAYS) - TICK] * 2
    fill(pg_db.engine, [*expired, *kept])

    with batch_counts() as counts:
        report = cleanup(pg_db.engine, days=DAYS, now=NOW, batch_size=5)

    assert report.deleted == len(expired) == 68
    assert sum(counts) == 68
    assert max(counts) == 5
    assert report.batches == len(counts) >= 14
    assert ages_left(pg_db.engine) == sorted(kept)


def test_pg_nothing_expired_is_no_batch(pg_db: Database) -> None:
    fill(pg_db.engine, [dt.timedelta(days=DAYS), dt.timedelta(0)])

    report = cleanup(pg_db.engine, days=DAYS, now=NOW, effect_table=None)

    assert (report.deleted, report.batches, report.longest_batch_seconds) == (0, 0, 0.0)
    assert len(ages_left(pg_db.engine)) == 2


def test_pg_the_walker_lock_is_released_after_each_table(pg_db: Database) -> None:
    fill(pg_db.engine, [dt.timedelta(days=90)] * 20)
    engine = create_engine(pg_db.url, pool_size=1, max_overflow=0)
    try:
        assert cleanup(engine, days=DAYS, now=NOW, batch_size=3).deleted == 20
        # The pooled session holds no advisory lock: the next cleanup is a walker again.
        with engine.connect() as connection:
            query = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            assert connection.execute(query).scalar_one() == 0
            # ... and the purge's synchronous_commit = off ended with its transactions.
            assert connection.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
    finally:
        engine.dispose()


def test_pg_the_walker_lock_is_released_when_a_batch_fails(pg_db: Database) -> None:
    fill(pg_db.engine, [dt.timedelta(days=90)] * 20)
    with pg_db.engine.begin() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION inbox_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'refused'; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER inbox_refuse BEFORE DELETE ON inbox_message "
                "FOR EACH ROW EXECUTE FUNCTION inbox_refuse()"
            )
        )
    engine = create_engine(pg_db.url, pool_size=1, max_overflow=0)
    try:
        with pytest.raises(Exception, match="refused"):
            cleanup(engine, days=DAYS, now=NOW)
        with engine.connect() as connection:
            query = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            assert connection.execute(query).scalar_one() == 0
    finally:
        engine.dispose()
    assert len(ages_left(pg_db.engine)) == 20


def test_pg_an_uncommitted_old_claim_is_neither_deleted_nor_waited_for(
    pg_db: Database, role: str
) -> None:
    fill(pg_db.engine, [dt.timedelta(days=90)] * 30 + [dt.timedelta(days=1)])
    other = create_engine(pg_db.url)
    try:
        with other.connect() as open_transaction:
            open_transaction.begin()
            # A claim whose clock says 100 days ago, in a transaction still open.
            fill(open_transaction, [dt.timedelta(days=100)], handler="uncommitted")
            began = time.monotonic()
            report = cleanup(pg_db.engine, days=DAYS, now=NOW, batch_size=4)
            assert time.monotonic() - began < 10
            assert report.deleted == 30
            open_transaction.commit()
        # Committed now: it is there, and the next run deletes it (it has expired).
        assert len(ages_left(pg_db.engine)) == 2
        assert cleanup(pg_db.engine, days=DAYS, now=NOW).deleted == 1
    finally:
        other.dispose()


def test_pg_a_claim_deleted_by_another_transaction_mid_batch_is_skipped(pg_db: Database) -> None:
    # The walker picks rows without locking them: one that another transaction deletes
    # meanwhile is waited for, then skipped; the count is what this cleanup deleted.
    fill(pg_db.engine, [dt.timedelta(days=90, seconds=i) for i in range(10)])
    oldest = NOW - dt.timedelta(days=90, seconds=9)
    other = create_engine(pg_db.url)
    reports = []
    try:
        with other.connect() as releasing:
            releasing.begin()
            releasing.execute(inbox_message.delete().where(inbox_message.c.processed_at == oldest))
            thread = threading.Thread(
                target=lambda: reports.append(cleanup(pg_db.engine, days=DAYS, now=NOW))
            )
            thread.start()
            thread.join(1.0)
            assert thread.is_alive(), "the walker waits for the row being deleted"
            releasing.commit()
            thread.join(10)
    finally:
        other.dispose()
    assert [r.deleted for r in reports] == [9]
    assert ages_left(pg_db.engine) == []


def test_pg_concurrent_inserts_during_the_purge_keep_every_young_claim(pg_db: Database) -> None:
    # 6,000 expired claims deleted in batches of 200 while another connection keeps inserting
    # fresh claims, claims a microsecond inside the window, and late claims with an old clock
    # (behind the walker's cursor). Nothing inside the window goes; every expired claim that
    # was committed before the run is gone; the late ones are gone or left for the next run.
    fill(pg_db.engine, [dt.timedelta(days=40, seconds=i) for i in range(6_000)])
    young: list[dt.timedelta] = []
    late: list[dt.timedelta] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    inserter = create_engine(pg_db.url)

    def insert_meanwhile() -> None:
        try:
            round_ = 0
            while not stop.is_set():
                round_ += 1
                batch_young = [dt.timedelta(0), dt.timedelta(days=DAYS) - TICK]
                batch_late = [dt.timedelta(days=45, seconds=round_)]
                with inserter.begin() as connection:
                    fill(connection, [*batch_young, *batch_late])
                young.extend(batch_young)
                late.extend(batch_late)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=insert_meanwhile)
    thread.start()
    try:
        report = cleanup(pg_db.engine, days=DAYS, now=NOW, batch_size=200)
    finally:
        stop.set()
        thread.join(10)
        inserter.dispose()
    assert not errors, errors
    assert len(young) >= 10, "the inserts ran during the purge"
    left = ages_left(pg_db.engine)
    inside = [age for age in left if age <= dt.timedelta(days=DAYS)]
    assert sorted(inside) == sorted(young)
    still_expired = len(left) - len(inside)
    assert report.deleted == 6_000 + len(late) - still_expired
    assert all(age >= dt.timedelta(days=45) for age in left if age not in inside)
    assert cleanup(pg_db.engine, days=DAYS, now=NOW).deleted == still_expired


def test_pg_a_walker_and_a_helper_together_delete_each_claim_once(pg_db: Database) -> None:
    fill(pg_db.engine, [dt.timedelta(days=40, seconds=i % 500) for i in range(5_000)])
    fill(pg_db.engine, [dt.timedelta(days=DAYS)] * 10)
    engines = [create_engine(pg_db.url, pool_size=1) for _ in range(3)]
    reports = []
    start = threading.Barrier(3)

    def run(engine: Engine) -> None:
        start.wait()
        reports.append(cleanup(engine, days=DAYS, now=NOW, batch_size=100))

    threads = [threading.Thread(target=run, args=(engine,)) for engine in engines]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for engine in engines:
            engine.dispose()
    assert sum(r.deleted for r in reports) == 5_000
    assert ages_left(pg_db.engine) == [dt.timedelta(days=DAYS)] * 10
    assert advisory_locks(pg_db) == 0


def test_pg_the_walker_lock_follows_the_schema_translate_map(pg_db: Database) -> None:
    # Two tenants' tables under one unqualified name: each has its own walker lock.
    with pg_db.engine.begin() as connection:
        schema = connection.execute(text("SELECT current_schema()")).scalar_one()
        connection.execute(text(f"CREATE SCHEMA {schema}_b"))
        connection.execute(text(f"CREATE TABLE {schema}_b.inbox_message (LIKE inbox_message)"))
    try:
        keys = []
        for tenant in (schema, f"{schema}_b"):
            engine = pg_db.engine.execution_options(schema_translate_map={None: tenant})
            with engine.connect() as connection:
                keys.append(_oid_key(connection, inbox_message))
        with pg_db.engine.connect() as connection:
            oids = connection.execute(
                text(
                    "SELECT CAST(CAST(to_regclass(:a) AS oid) AS int4), "
                    "CAST(CAST(to_regclass(:b) AS oid) AS int4)"
                ),
                {"a": f"{schema}.inbox_message", "b": f"{schema}_b.inbox_message"},
            ).one()
        assert keys == list(oids)
        assert keys[0] != keys[1]
    finally:
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA {schema}_b CASCADE"))
