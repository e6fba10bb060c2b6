"""Cleanup of Celery inbox tasks' stored results (``inbox_task_result``): a result goes once
it is past the window, after the claims; a young one stays; the revisions create the table."""

from __future__ import annotations

import datetime as dt
import io
import os

from sqlalchemy import Engine, insert, select
from support.databases import Database

from inbox import cleanup
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_message, inbox_task_result

NOW = dt.datetime(2026, 6, 1, 12, tzinfo=dt.UTC)
OLD = NOW - dt.timedelta(days=40)
YOUNG = NOW - dt.timedelta(days=2)


def task_run(engine: Engine, key: bytes, task: str, at: dt.datetime) -> None:
    """A committed inbox task: its claim and its stored value, written together."""
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_message).values(message_id=key, handler=task, processed_at=at)
        )
        connection.execute(
            insert(inbox_task_result).values(claim_key=key, task=task, result='"ok"', stored_at=at)
        )


def kept(engine: Engine) -> set[tuple[bytes, str]]:
    query = select(inbox_task_result.c.claim_key, inbox_task_result.c.task)
    with engine.connect() as connection:
        return {(row.claim_key.bytes, row.task) for row in connection.execute(query)}


def test_old_task_results_go_in_batches_and_young_ones_stay(db: Database) -> None:
    engine = db.engine
    old = [(os.urandom(16), task) for task in ("shop.charge", "shop.ship") for _ in range(3)]
    young = (os.urandom(16), "shop.charge")
    for key, task in old:
        task_run(engine, key, task, OLD)
    task_run(engine, *young, YOUNG)

    dry = cleanup(engine, days=30, now=NOW, dry_run=True)
    assert (dry.deleted, dry.results_deleted) == (6, 6)
    assert len(kept(engine)) == 7, "a dry run deletes nothing"

    report = cleanup(engine, days=30, now=NOW, batch_size=4)
    assert (report.deleted, report.results_deleted) == (6, 6)
    assert report.batches == 2  # claims: 4 + 2
    assert kept(engine) == {young}


def test_cleanup_works_on_a_database_without_the_result_table(db: Database) -> None:
    inbox_task_result.drop(db.engine)
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message).values(message_id=os.urandom(16), handler="t", processed_at=OLD)
        )
    report = cleanup(db.engine, days=30, now=NOW)
    assert (report.deleted, report.results_deleted) == (1, 0)


def test_inbox_cleanup_says_how_many_task_results_went(db: Database) -> None:
    key = os.urandom(16)
    task_run(db.engine, key, "shop.charge", dt.datetime.now(dt.UTC) - dt.timedelta(days=40))
    task_run(db.engine, os.urandom(16), "shop.charge", dt.datetime.now(dt.UTC))
    out = io.StringIO()
    assert cleanup_main(["--database-url", db.url, "--days", "30", "--dry-run"], stdout=out) == 0
    assert "would delete 1 stored task results" in out.getvalue()
    out = io.StringIO()
    assert cleanup_main(["--database-url", db.url, "--days", "30"], stdout=out) == 0
    assert "deleted 1 claims" in out.getvalue()
    assert "and 1 stored task results" in out.getvalue()
    assert len(kept(db.engine)) == 1


def test_a_result_stays_while_its_claim_does(db: Database) -> None:
    """A claim can outlive its result's ``stored_at`` (here: stamped by a clock 3 days behind
    the worker's that stored the value): the result goes with the claim, not before it."""
    engine = db.engine
    key = os.urandom(16)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_message).values(message_id=key, handler="shop.charge", processed_at=YOUNG)
        )
        connection.execute(
            insert(inbox_task_result).values(
                claim_key=key, task="shop.charge", result="41", stored_at=OLD
            )
        )
    orphan = os.urandom(16)  # its claim already gone: the result goes
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_task_result).values(
                claim_key=orphan, task="shop.charge", result="7", stored_at=OLD
            )
        )

    assert cleanup(engine, days=30, now=NOW, dry_run=True).results_deleted == 1
    report = cleanup(engine, days=30, now=NOW)
    assert (report.deleted, report.results_deleted) == (0, 1)
    assert kept(engine) == {(key, "shop.charge")}

    later = cleanup(engine, days=30, now=YOUNG + dt.timedelta(days=31))
    assert (later.deleted, later.results_deleted) == (1, 1), "claim, then its result"
    assert kept(engine) == set()
