"""Partitioning by message id on real PostgreSQL: the primary key stays the duplicate guard for
the whole table, retention drops expired day partitions without losing a young claim, and the
partition maintenance runs beside busy workers.

Every test gets a fresh schema (conftest's ``pg_db``) whose plain inbox table is replaced by a
partitioned one. Claims go through ``Inbox.process``; message ids are minted for chosen times
(:func:`uuid7_at`) so that they land in chosen partitions.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, func, insert, inspect, select, text
from sqlalchemy.orm import sessionmaker
from support.databases import Database, effects
from support.effects import Recorder

from inbox import CleanupReport, Inbox, Message, Outcome, cleanup
from inbox.errors import UnsupportedDialect
from inbox.message import key_bytes
from inbox.partitioning import (
    Partition,
    PartitionLayoutError,
    create_partitioned_table,
    drop_partitions,
    ensure_partitions,
    id_floor,
    is_partitioned,
    list_partitions,
    skip_partitions,
)
from inbox.partitioning._ids import KEYS_BOUND
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_message, metadata

ROOT = Path(__file__).resolve().parent.parent
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
DAYS = 30
HANDLER = "part.apply"
START_DAYS_AGO = 45


def uuid7_at(moment: dt.datetime) -> uuid.UUID:
    """A UUIDv7 minted at ``moment``: its 48-bit millisecond timestamp, then random bits."""
    milliseconds = (moment - EPOCH) // dt.timedelta(milliseconds=1)
    raw = bytearray(milliseconds.to_bytes(6, "big") + os.urandom(10))
    raw[6] = 0x70 | (raw[6] & 0x0F)
    raw[8] = 0x80 | (raw[8] & 0x3F)
    return uuid.UUID(bytes=bytes(raw))


def midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


@pytest.fixture
def part_db(pg_db: Database) -> Database:
    """``pg_db`` with ``inbox_message`` partitioned: day partitions from 45 days ago until a
    week ahead."""
    with pg_db.engine.begin() as connection:
        inbox_message.drop(connection)
        create_partitioned_table(connection, start=today() - START_DAYS_AGO * DAY, days_ahead=7)
    return pg_db


def recorder_on(engine: Engine, *, key: Callable[[Message], object] | None = None) -> Recorder:
    recorder = Recorder(Inbox(sessionmaker(engine)))
    recorder.add(HANDLER, key=key)
    return recorder


def message_at(moment: dt.datetime, ref: str, **headers: str) -> Message:
    return Message(uuid7_at(moment), "op", {"ref": ref}, headers or None)


def home_of(db: Database, key: bytes) -> str:
    """The partition holding the claim of ``key``."""
    with db.engine.connect() as connection:
        return str(
            connection.execute(
                text("SELECT tableoid::regclass::text FROM inbox_message WHERE message_id = :k"),
                {"k": key},
            ).scalar_one()
        )


def partition_names(db: Database) -> list[str]:
    return [p.name for p in list_partitions(db.engine)]


def expected_home(partitions: list[Partition], key: bytes) -> str:
    """Where PostgreSQL must route ``key``, computed from the ranges."""
    for partition in partitions:
        if partition.is_default:
            continue
        if (partition.lower is None or partition.lower <= key) and (
            partition.upper is None or key < partition.upper
        ):
            return partition.name
    return next(p.name for p in partitions if p.is_default)


def day_name(day: dt.date) -> str:
    return f"inbox_message_p{day:%Y%m%d}"


def test_the_table_matches_the_schema_and_has_the_documented_layout(pg_db: Database) -> None:
    assert not is_partitioned(pg_db.engine)
    with pg_db.engine.begin() as connection:
        inbox_message.drop(connection)
        created = create_partitioned_table(connection, start=today() - 2 * DAY, days_ahead=3)
    assert is_partitioned(pg_db.engine)

    days = [today() + n * DAY for n in range(-2, 4)]
    assert created == [
        "inbox_message_before",
        *[day_name(d) for d in days],
        "inbox_message_future",
        "inbox_message_keys",
    ]
    partitions = list_partitions(pg_db.engine)
    assert [p.name for p in partitions] == created
    assert partitions[0].is_default
    for partition, day in zip(partitions[1:-2], days, strict=True):
        assert (partition.lower, partition.upper) == (id_floor(day), id_floor(day + DAY))
    assert (partitions[-2].lower, partitions[-2].upper) == (id_floor(days[-1] + DAY), KEYS_BOUND)
    assert (partitions[-1].lower, partitions[-1].upper) == (KEYS_BOUND, None)
    assert KEYS_BOUND.hex() == "03" + "00" * 15

    # Columns, types, primary key and processed_at index exactly as inbox.schema says; the
    # partitions are hidden from autogenerate by skip_partitions (and the suite's effects
    # table by the second condition).
    skip = skip_partitions()

    def include(name: str | None, type_: str, parents: Mapping[str, str | None]) -> bool:
        return skip(name, type_, parents) and not (type_ == "table" and name == "effects")

    with pg_db.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": include}
        )
        assert compare_metadata(context, metadata) == []
        unfiltered = MigrationContext.configure(connection, opts={"compare_type": True})
        removed = {
            d[1].name for d in compare_metadata(unfiltered, metadata) if d[0] == "remove_table"
        }
        assert removed == {"effects", *created}, "without the filter the partitions show up"
    inspector = inspect(pg_db.engine)
    assert inspector.get_pk_constraint("inbox_message") == {
        "constrained_columns": ["message_id", "handler"],
        "name": "inbox_message_pkey",
        "comment": None,
        "dialect_options": {"postgresql_include": []},
    }
    [index] = inspector.get_indexes("inbox_message")
    assert (index["name"], index["column_names"], index["unique"]) == (
        "ix_inbox_message_processed_at",
        ["processed_at"],
        False,
    )


def test_bad_uses_are_refused(pg_db: Database, tmp_path: Path) -> None:
    sqlite = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(UnsupportedDialect), sqlite.begin() as connection:
        create_partitioned_table(connection)
    sqlite.dispose()
    with pytest.raises(PartitionLayoutError, match="inbox_message_future"):
        ensure_partitions(pg_db.engine)  # the fixture's table is not partitioned
    with pytest.raises(ValueError, match="at most 53"), pg_db.engine.begin() as connection:
        create_partitioned_table(connection, "x" * 54)
    with pytest.raises(TypeError, match="date"), pg_db.engine.begin() as connection:
        create_partitioned_table(connection, "t2", start=dt.datetime.now(dt.UTC))  # type: ignore[arg-type]


def test_a_redelivery_processed_days_later_is_still_a_duplicate(part_db: Database) -> None:
    recorder = recorder_on(part_db.engine)
    now = dt.datetime.now(dt.UTC)
    messages = {
        "inbox_message_before": message_at(now - 60 * DAY, "before"),
        day_name(today() - 10 * DAY): message_at(now - 10 * DAY, "day"),
        day_name(today()): message_at(now, "today"),
        "inbox_message_future": message_at(now + 10 * DAY, "future"),
        "inbox_message_keys": Message(
            uuid.UUID(bytes=b"\xf0" + os.urandom(15)), "op", {"ref": "k"}
        ),
    }
    for partition, message in messages.items():
        assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
        assert home_of(part_db, message.id.bytes) == partition
    # The first deliveries were processed five days ago; since then the daily cron created
    # partitions (splitting _future: the future message moves to its new day partition) and
    # purged. A table partitioned by processed_at would now put the redeliveries into
    # another partition than their first claims, and run them again.
    with part_db.engine.begin() as connection:
        connection.execute(
            text("UPDATE inbox_message SET processed_at = processed_at - interval '5 days'")
        )
    created = ensure_partitions(part_db.engine, now=now + 5 * DAY)
    assert day_name(today() + 10 * DAY) in created
    report = cleanup(part_db.engine, days=DAYS)
    assert report.deleted == 0
    assert report.partitions_dropped  # the empty expired day partitions

    for message in messages.values():
        assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
    assert home_of(part_db, messages["inbox_message_future"].id.bytes) == day_name(
        today() + 10 * DAY
    )
    assert part_db.effect_counts() == {(m.body["ref"], HANDLER): 1 for m in messages.values()}


def test_business_keys_deduplicate_and_land_where_their_bytes_say(part_db: Database) -> None:
    recorder = recorder_on(part_db.engine)
    now = dt.datetime.now(dt.UTC)
    operations = [f"order-created-{i}" for i in range(400)]
    for ref in operations:
        first = message_at(now - 3 * DAY, ref, **{"idempotency-key": ref})
        again = message_at(now, ref, **{"idempotency-key": ref})  # re-sent under a fresh id
        assert recorder.inbox.process(first).outcome is Outcome.PROCESSED
        assert recorder.inbox.process(again).outcome is Outcome.DUPLICATE
    assert part_db.effect_counts() == {(ref, HANDLER): 1 for ref in operations}

    partitions = list_partitions(part_db.engine)
    homes = Counter()
    for ref in operations:
        key = key_bytes(ref)
        home = home_of(part_db, key)
        assert home == expected_home(partitions, key)
        homes[home] += 1
    # uuid5 bytes are uniform: ~98.8 % of the keys are in _keys, a few elsewhere.
    assert homes["inbox_message_keys"] >= 0.95 * len(operations)
    assert len(homes) > 1, homes


def seed(db: Database, rows: list[tuple[bytes, dt.datetime]]) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [{"message_id": k, "handler": HANDLER, "processed_at": at} for k, at in rows],
        )


def all_claims(db: Database) -> dict[bytes, dt.datetime]:
    with db.engine.connect() as connection:
        rows = connection.execute(select(inbox_message.c.message_id, inbox_message.c.processed_at))
        return {key.bytes: at for key, at in rows}


def test_purge_drops_expired_day_partitions_and_keeps_every_young_claim(
    part_db: Database,
) -> None:
    now = dt.datetime.now(dt.UTC)
    first_day = today() - START_DAYS_AGO * DAY
    rows: list[tuple[bytes, dt.datetime]] = []
    for offset in range(START_DAYS_AGO + 1):  # 12 claims a day, processed a minute after minting
        for hour in range(0, 24, 2):
            minted = midnight(first_day + offset * DAY) + dt.timedelta(hours=hour)
            if minted < now:
                rows.append((uuid7_at(minted).bytes, minted + dt.timedelta(minutes=1)))
    for minted in (now - 60 * DAY, now + 20 * DAY):  # _before and _future: old and young claims
        rows += [(uuid7_at(minted).bytes, now - 40 * DAY), (uuid7_at(minted).bytes, now - DAY)]
    keys = [b"\xf1" + os.urandom(15), b"\xf2" + os.urandom(15)]  # _keys: old and young
    rows += [(keys[0], now - 40 * DAY), (keys[1], now - DAY)]
    seed(part_db, rows)

    # Young claims in old ranges, through the inbox: a producer whose clock is 40 days
    # behind, and a business key whose bytes fall into the range of 38 days ago.
    slow_clock = message_at(midnight(today() - 40 * DAY) + 12 * dt.timedelta(hours=1), "slow")
    business_key = id_floor(midnight(today() - 38 * DAY) + 6 * dt.timedelta(hours=1))[:6]
    business_key += os.urandom(10)
    recorder = recorder_on(
        part_db.engine, key=lambda m: bytes.fromhex(m.body["key"]) if "key" in m.body else m.id
    )
    assert recorder.inbox.process(slow_clock).outcome is Outcome.PROCESSED
    keyed = Message.new("op", {"ref": "keyed", "key": business_key.hex()})
    assert recorder.inbox.process(keyed).outcome is Outcome.PROCESSED
    assert home_of(part_db, slow_clock.id.bytes) == day_name(today() - 40 * DAY)
    assert home_of(part_db, business_key) == day_name(today() - 38 * DAY)

    before = all_claims(part_db)
    cutoff = now - DAYS * DAY
    expired = {k for k, at in before.items() if at < cutoff}
    young = {k: at for k, at in before.items() if at >= cutoff}
    assert len(expired) > 150
    assert len(young) > 150

    report = cleanup(part_db.engine, days=DAYS, batch_size=7, now=now)

    # Whole day partitions of ids minted before the cutoff went, except the two holding a
    # young claim; everything else was deleted row by row.
    droppable = [
        first_day + n * DAY
        for n in range(START_DAYS_AGO)
        if first_day + (n + 1) * DAY <= cutoff.date()
    ]
    kept_old = {today() - 40 * DAY, today() - 38 * DAY}
    assert set(report.partitions_dropped) == {day_name(d) for d in droppable if d not in kept_old}
    assert len(report.partitions_dropped) == START_DAYS_AGO - DAYS - 2
    assert all_claims(part_db) == young
    assert report.deleted == len(expired)
    assert report.batches > 0
    assert 0 < report.longest_batch_seconds <= report.seconds
    names = partition_names(part_db)
    assert {day_name(d) for d in kept_old} <= set(names)
    assert not set(report.partitions_dropped) & set(names)

    # The dropped ranges fell to _before: an id minted there still has a home, and dedupes.
    late = message_at(midnight(droppable[0]) + dt.timedelta(hours=3), "late")
    assert recorder.inbox.process(late).outcome is Outcome.PROCESSED
    assert home_of(part_db, late.id.bytes) == "inbox_message_before"
    assert recorder.inbox.process(late).outcome is Outcome.DUPLICATE
    assert recorder.inbox.process(slow_clock).outcome is Outcome.DUPLICATE
    assert recorder.inbox.process(keyed).outcome is Outcome.DUPLICATE

    # Run again: nothing left to drop or delete.
    again = cleanup(part_db.engine, days=DAYS, now=now)
    assert (again.deleted, again.partitions_dropped) == (0, ())


def test_two_concurrent_purges_drop_each_partition_once(part_db: Database) -> None:
    """Two cleanups at once: each expired partition dropped by one of them, every expired
    claim counted once in the two reports together (a claim in a partition that one run
    drops while the other deletes its rows in batches, before it is dropped, counted by the
    run that removed it), and no young claim deleted."""
    now = dt.datetime.now(dt.UTC)
    first_day = today() - START_DAYS_AGO * DAY
    seed(
        part_db,
        [
            (
                uuid7_at(midnight(first_day + n * DAY) + dt.timedelta(minutes=m)).bytes,
                now - 40 * DAY,
            )
            for n in range(START_DAYS_AGO - DAYS - 1)
            for m in range(0, 1440, 10)
        ]
        + [(b"\xf3" + os.urandom(15), now - 40 * DAY) for _ in range(3000)],  # batched, in _keys
    )
    expired = len(all_claims(part_db))
    young = [(b"\xf4" + os.urandom(15), now - DAY) for _ in range(200)]  # _keys, kept
    young += [(uuid7_at(now - n * dt.timedelta(minutes=7)).bytes, now - DAY) for n in range(200)]
    seed(part_db, young)
    engines = [create_engine(part_db.url, pool_size=1, max_overflow=0) for _ in range(2)]
    start = threading.Barrier(2)
    reports: list[CleanupReport] = []
    errors: list[BaseException] = []

    def purge(engine: Engine) -> None:
        try:
            start.wait()
            reports.append(cleanup(engine, days=DAYS, batch_size=100, now=now))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=purge, args=(engine,)) for engine in engines]
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
    assert not set(first.partitions_dropped) & set(second.partitions_dropped)
    dropped = {*first.partitions_dropped, *second.partitions_dropped}
    cutoff_day = (now - DAYS * DAY).date()
    assert dropped == {
        day_name(first_day + n * DAY)
        for n in range(START_DAYS_AGO)
        if first_day + (n + 1) * DAY <= cutoff_day
    }
    assert first.deleted + second.deleted == expired
    assert all_claims(part_db) == dict(young)


def test_drops_share_a_lock_until_the_hold_budget_is_spent(part_db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    days = [today() - n * DAY for n in range(44, 34, -1)]  # ten old day partitions
    seed(  # n + 1 expired claims in the n-th partition
        part_db,
        [
            (uuid7_at(midnight(d) + dt.timedelta(hours=h)).bytes, now - 40 * DAY)
            for n, d in enumerate(days)
            for h in range(n + 1)
        ],
    )
    young = uuid7_at(midnight(days[-1]) + dt.timedelta(hours=20)).bytes
    seed(part_db, [(young, now - DAY)])
    names = [day_name(d) for d in days]
    cutoff = now - DAYS * DAY

    one_by_one = drop_partitions(
        part_db.engine, "inbox_message", names[:5], cutoff=cutoff, hold_seconds=0
    )
    together = drop_partitions(
        part_db.engine, "inbox_message", names[5:], cutoff=cutoff, hold_seconds=60
    )

    assert one_by_one.dropped == tuple((name, n + 1) for n, name in enumerate(names[:5]))
    assert one_by_one.transactions == 5
    # The last one holds a young claim: kept.
    assert together.dropped == tuple((name, n + 6) for n, name in enumerate(names[5:9]))
    assert together.transactions == 1
    assert 0 < together.longest_seconds < 60
    assert set(partition_names(part_db)) & set(names) == {names[-1]}
    assert young in all_claims(part_db)


def test_a_partition_detached_by_an_interrupted_run_is_dropped_by_the_next(
    part_db: Database,
) -> None:
    leftover = day_name(today() - 44 * DAY)
    seed(
        part_db,
        [(uuid7_at(midnight(today() - 44 * DAY)).bytes, dt.datetime.now(dt.UTC) - 44 * DAY)],
    )
    with part_db.engine.begin() as connection:  # the run stopped after detaching
        connection.execute(text(f"ALTER TABLE inbox_message DETACH PARTITION {leftover}"))
        connection.execute(text("CREATE TABLE inbox_message_pnotes (x int)"))  # not a day
    assert leftover not in partition_names(part_db)
    assert leftover in inspect(part_db.engine).get_table_names()

    report = cleanup(part_db.engine, days=DAYS)

    # Its claim was deleted by this run, so the report counts it.
    assert leftover in report.partitions_dropped
    assert report.deleted == 1
    tables = set(inspect(part_db.engine).get_table_names())
    assert leftover not in tables
    assert "inbox_message_pnotes" in tables


def test_batches_run_per_partition_because_ctids_repeat_across_partitions(
    part_db: Database,
) -> None:
    now = dt.datetime.now(dt.UTC)
    old_key = b"\xf0" + os.urandom(15)  # _keys, expired
    young_key = uuid7_at(now - 60 * DAY).bytes  # _before, young
    seed(part_db, [(old_key, now - 40 * DAY), (young_key, now - DAY)])
    with part_db.engine.begin() as connection:
        ctids = connection.execute(
            text("SELECT ctid::text FROM inbox_message ORDER BY tableoid::regclass::text")
        ).scalars()
        assert list(ctids) == ["(0,1)", "(0,1)"]
        # What a batch keyed by ctid alone would do on the parent: hit both rows.
        gone = connection.execute(text("DELETE FROM inbox_message WHERE ctid = '(0,1)'"))
        assert gone.rowcount == 2
        connection.rollback()

    report = cleanup(part_db.engine, days=DAYS, now=now)

    assert report.deleted == 1
    assert set(all_claims(part_db)) == {young_key}


def test_a_future_claim_survives_the_split_of_future_and_still_deduplicates(
    part_db: Database,
) -> None:
    recorder = recorder_on(
        part_db.engine, key=lambda m: bytes.fromhex(m.body["key"]) if "key" in m.body else m.id
    )
    now = dt.datetime.now(dt.UTC)
    fast_clock = message_at(now + 10 * DAY, "fast")
    far_key = id_floor(now + 300 * DAY)[:6] + os.urandom(10)
    keyed = Message.new("op", {"ref": "far", "key": far_key.hex()})
    for message in (fast_clock, keyed):
        assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
    assert home_of(part_db, fast_clock.id.bytes) == "inbox_message_future"
    assert home_of(part_db, far_key) == "inbox_message_future"
    layout = list_partitions(part_db.engine)

    created = ensure_partitions(part_db.engine, now=now + 5 * DAY)

    assert created == [day_name(today() + n * DAY) for n in range(8, 13)]
    assert home_of(part_db, fast_clock.id.bytes) == day_name(today() + 10 * DAY)
    assert home_of(part_db, far_key) == "inbox_message_future"
    for message in (fast_clock, keyed):
        assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
    assert part_db.effect_counts() == {("fast", HANDLER): 1, ("far", HANDLER): 1}
    assert [p.name for p in list_partitions(part_db.engine)] == [
        *[p.name for p in layout[:-2]],
        *created,
        "inbox_message_future",
        "inbox_message_keys",
    ]


def test_ensure_partitions_is_idempotent(part_db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    layout = list_partitions(part_db.engine)
    assert ensure_partitions(part_db.engine, days_ahead=7, now=now) == []
    assert ensure_partitions(part_db.engine, days_ahead=3, now=now) == []
    assert list_partitions(part_db.engine) == layout

    first = ensure_partitions(part_db.engine, days_ahead=9, now=now)
    assert first == [day_name(today() + 8 * DAY), day_name(today() + 9 * DAY)]
    after = list_partitions(part_db.engine)
    assert ensure_partitions(part_db.engine, days_ahead=9, now=now) == []
    assert list_partitions(part_db.engine) == after


def test_inbox_cleanup_keeps_a_partitioned_table_healthy(part_db: Database) -> None:
    seed(
        part_db,
        [(uuid7_at(midnight(today() - 44 * DAY)).bytes, dt.datetime.now(dt.UTC) - 44 * DAY)],
    )
    out, err = io.StringIO(), io.StringIO()
    argv = ["--days", str(DAYS), "--partitions-ahead", "10", "--database-url", part_db.url]

    assert cleanup_main(argv, stdout=out, stderr=err) == 0

    assert err.getvalue() == ""
    [line] = out.getvalue().splitlines()
    dropped = START_DAYS_AGO - DAYS
    assert re.search(rf"deleted 1 claims .* {dropped} partitions dropped, 3 created", line), line
    assert "longest" in line
    names = partition_names(part_db)
    assert day_name(today() + 10 * DAY) in names
    assert day_name(today() - 44 * DAY) not in names
    out = io.StringIO()
    assert cleanup_main([*argv, "--quiet"], stdout=out, stderr=err) == 0
    assert (out.getvalue(), err.getvalue()) == ("", "")


# Regression (issue 15, bug 10): a cutoff before 1970 has no UUIDv7 id, and id_floor's
# ValueError was reported as a database error (exit 1) on every run.
def test_a_window_reaching_before_1970_works_as_on_a_plain_table(part_db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    seed(part_db, [(uuid7_at(now - 40 * DAY).bytes, now - 40 * DAY)])
    out, err = io.StringIO(), io.StringIO()
    argv = ["--days", "36500", "--database-url", part_db.url]

    assert cleanup_main(argv, stdout=out, stderr=err) == 0, err.getvalue()

    assert err.getvalue() == ""
    assert "deleted 0 claims processed before 19" in out.getvalue()
    report = cleanup(part_db.engine, days=36500, now=now)
    assert (report.deleted, report.partitions_dropped) == (0, ())
    assert len(all_claims(part_db)) == 1


def operations_doc_block(marker: str) -> str:
    doc = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```\s*<!-- /{marker} -->", doc, re.S)
    assert match is not None, f"docs/operations.md has no {marker} block"
    return match.group(1)


RECIPE_ENV = """
from alembic import context
from sqlalchemy import create_engine

import inbox.schema
from inbox.partitioning import skip_partitions

engine = create_engine(context.config.attributes["url"])
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=inbox.schema.metadata,
        include_name=skip_partitions(),
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""


def test_the_documented_revision_creates_the_partitioned_table(
    pg_db: Database, tmp_path: Path
) -> None:
    with pg_db.engine.begin() as connection:
        inbox_message.drop(connection)
        effects.drop(connection)  # an empty database: autogenerate sees the inbox only
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(RECIPE_ENV)
    (tmp_path / "versions" / "a1b2c3d4e5f6_partitioned_inbox.py").write_text(
        operations_doc_block("partitioned-revision")
    )
    config = Config()
    config.set_main_option("script_location", str(tmp_path))
    config.attributes["url"] = pg_db.url

    command.upgrade(config, "head")

    assert is_partitioned(pg_db.engine)
    assert partition_names(pg_db)[-2:] == ["inbox_message_future", "inbox_message_keys"]
    command.check(config)  # autogenerate: nothing to do (the partitions are skipped)
    inbox = Inbox(sessionmaker(pg_db.engine))
    inbox.handler("op", name=HANDLER)(lambda message, session: None)
    message = Message.new("op", {"ref": "r"})
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE

    command.downgrade(config, "base")

    tables = set(inspect(pg_db.engine).get_table_names())
    assert not {t for t in tables if t.startswith("inbox_message")}


WORKERS = 4
DEADLINE = 120.0


def test_maintenance_and_purge_beside_four_busy_workers(part_db: Database) -> None:
    """ensure_partitions splits _future ten times and the purge drops the expired day
    partitions while four threads process messages whose claims land in every kind of
    partition (including the ones being split and dropped). Every message is delivered
    twice, by two different workers: exactly one delivery runs, the other is a duplicate,
    and no error reaches a worker (transient ones are re-run inside the inbox)."""
    now = dt.datetime.now(dt.UTC)
    first_day = today() - START_DAYS_AGO * DAY
    # Expired claims in the old day partitions, so the purge has something to drop.
    seed(
        part_db,
        [
            (
                uuid7_at(midnight(first_day + n * DAY) + dt.timedelta(minutes=m)).bytes,
                now - 40 * DAY,
            )
            for n in range(START_DAYS_AGO - DAYS - 1)
            for m in range(0, 1440, 15)
        ],
    )
    engine = create_engine(part_db.url, pool_size=WORKERS, max_overflow=0)
    recorder = recorder_on(engine)
    messages: list[Message] = []
    for i in range(150):
        messages.append(Message.new("op", {"ref": f"new-{i}"}))
        # Fast clocks: ids in the range the splits carve out of _future.
        messages.append(
            message_at(now + (3 + i % 8) * DAY + i * dt.timedelta(minutes=7), f"fast-{i}")
        )
        # Slow clocks: ids in old ranges, only on even days (odd days must be droppable).
        minted = midnight(first_day + (2 * (i % 7)) * DAY) + i * dt.timedelta(minutes=5)
        messages.append(message_at(minted, f"slow-{i}"))
        ref = f"order-{i}"
        messages.append(message_at(now - DAY, ref, **{"idempotency-key": ref}))
    plans: list[list[Message]] = [[] for _ in range(WORKERS)]
    for i, message in enumerate(messages):
        plans[i % WORKERS].append(message)
        plans[(i + 1) % WORKERS].append(message)
    for n, plan in enumerate(plans):
        plan.sort(key=lambda m: hash((n, m.id)))

    outcomes: dict[str, Counter[Outcome]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    created: list[str] = []
    reports: list[CleanupReport] = []
    start = threading.Barrier(WORKERS + 2)
    workers_done = threading.Event()
    maintainer_engine = create_engine(part_db.url, pool_size=1, max_overflow=0)
    cleaner_engine = create_engine(part_db.url, pool_size=1, max_overflow=0)

    finished: list[float] = []  # when each worker finished
    changed: list[float] = []  # when a split or a drop committed

    def work(plan: list[Message]) -> None:
        try:
            start.wait()
            for message in plan:
                outcome = recorder.inbox.process(message).outcome
                with lock:
                    outcomes.setdefault(message.body["ref"], Counter())[outcome] += 1
            finished.append(time.perf_counter())
        except BaseException as exc:
            errors.append(exc)

    def maintain() -> None:
        try:
            start.wait()
            for step in range(1, 11):
                new = ensure_partitions(maintainer_engine, days_ahead=7, now=now + step * DAY)
                created.extend(new)
                changed.extend([time.perf_counter()] * len(new))
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    def clean() -> None:
        try:
            start.wait()
            while not workers_done.is_set():
                report = cleanup(cleaner_engine, days=DAYS, batch_size=50)
                reports.append(report)
                changed.extend([time.perf_counter()] * len(report.partitions_dropped))
                time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(plan,)) for plan in plans]
    helpers = [threading.Thread(target=maintain), threading.Thread(target=clean)]
    try:
        for thread in [*threads, *helpers]:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        workers_done.set()
        for thread in helpers:
            thread.join(DEADLINE)
    finally:
        workers_done.set()
        engine.dispose()
        maintainer_engine.dispose()
        cleaner_engine.dispose()
    assert not errors, errors
    assert not any(t.is_alive() for t in [*threads, *helpers])

    dropped = {name for report in reports for name in report.partitions_dropped}
    odd_days = {day_name(first_day + n * DAY) for n in range(1, START_DAYS_AGO - DAYS - 1, 2)}
    assert odd_days <= dropped
    assert len(created) == 10
    # The partition changes happened while the workers were busy, not after them.
    assert len(changed) >= 10 + len(odd_days)
    assert max(changed) < min(finished), "every split and drop overlapped the load"
    assert {ref: dict(c) for ref, c in outcomes.items()} == {
        m.body["ref"]: {Outcome.PROCESSED: 1, Outcome.DUPLICATE: 1} for m in messages
    }
    assert part_db.effect_counts() == {(m.body["ref"], HANDLER): 1 for m in messages}
    with part_db.engine.connect() as connection:
        claims = connection.execute(
            select(func.count()).where(inbox_message.c.processed_at >= now - DAY)
        ).scalar_one()
    assert claims == len(messages)
    assert part_db.count(effects) == len(messages)
