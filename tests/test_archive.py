"""The dead-letter archive's operations (issue 34 item 4): archiving a Celery dead letter on
Redis and restoring it as a Celery task message, a preview that archives nothing,
``inbox dlq archive`` on RabbitMQ, and ``inbox-cleanup --archive-days`` deleting only the
rows archived longer ago."""

from __future__ import annotations

import datetime as dt
import getpass
import io
import json
import uuid
from decimal import Decimal

import pytest
from console_support import dead_letter, declare_queues
from sqlalchemy import select, update
from support.databases import Database
from support.rabbit import Rabbit
from support.redis import redis_area
from test_console_redis import BROKER, celery_letter

from inbox.admin.cli import admin_main
from inbox.operations import _archive
from inbox.operations._dead_letter_sources import open_dead_letters
from inbox.operations._dead_letters import REPLAYS, dead_letter_queue
from inbox.operations._filters import Filters
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_dead_letter_archive as archive_table


def test_a_redis_dead_letter_is_archived_then_restored_as_a_celery_task(
    pg_db: Database,
) -> None:
    with redis_area(BROKER) as area:
        queue = area.stream("celery")
        celery_letter(area.url, queue, "task-a", "handler-failed", "ValueError: card 7 declined")
        celery_letter(area.url, queue, "task-b", "handler-failed", "ValueError: other")
        only_a = Filters(message_ids=frozenset({"task-a"}))
        with open_dead_letters(area.url) as source:
            preview = _archive.archive(
                source, pg_db.engine, archive_table, queue, filters=only_a, who="bob", dry_run=True
            )
            assert preview.moved == 1
            assert _archive.count_archived(pg_db.engine, archive_table) == 0
            done = _archive.archive(
                source, pg_db.engine, archive_table, queue, filters=only_a, who="bob"
            )
        assert done.moved == 1
        with area.client() as client:
            assert client.llen(f"{queue}.dlq") == 1
        (row,) = _archive.listed(pg_db.engine, archive_table)
        assert (row.ref, row.queue, row.source, row.archived_by) == (
            "task-a",
            queue,
            "redis",
            "bob",
        )
        assert row.error == "ValueError: card 7 declined"

        with open_dead_letters(area.url) as source:
            restored = _archive.restore(source, pg_db.engine, archive_table, [row.id, uuid.uuid4()])
        assert [r.ref for r in restored] == ["task-a"]
        with area.client() as client:
            (raw,) = client.lrange(queue, 0, -1)
        envelope = json.loads(raw)
        assert envelope["headers"]["id"] == "task-a"  # a Celery task message again
        assert envelope["headers"]["task"] == "app.tasks.charge"
        assert envelope["headers"][REPLAYS] == 1
        assert "x-inbox-reason" not in envelope["headers"]
        assert _archive.count_archived(pg_db.engine, archive_table) == 0


def test_inbox_cleanup_archive_days_deletes_only_the_old_archived_rows(pg_db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [
        {
            "id": uuid.uuid4(),
            "queue": "q",
            "ref": f"m{n}",
            "source": "amqp",
            "reason": "handler-failed",
            "error": None,
            "headers": "{}",
            "properties": "{}",
            "body": b"{}",
            "dead_lettered_at": None,
            "archived_at": now - dt.timedelta(days=days),
            "archived_by": "alice",
        }
        for n, days in enumerate((1, 9, 40))
    ]
    with pg_db.engine.begin() as connection:
        connection.execute(archive_table.insert(), rows)

    def cleanup(*argv: str) -> str:
        out = io.StringIO()
        code = cleanup_main(
            ["--days", "30", "--database-url", pg_db.url, *argv], stdout=out, stderr=io.StringIO()
        )
        assert code == 0, out.getvalue()
        return out.getvalue()

    assert "archived" not in cleanup()  # without --archive-days the archive is kept
    assert "would delete 2 dead letters archived more than 7 days ago" in cleanup(
        "--archive-days", "7", "--dry-run"
    )
    assert "deleted 2 dead letters archived more than 7 days ago" in cleanup("--archive-days", "7")
    with pg_db.engine.connect() as connection:
        left = connection.execute(select(archive_table.c.ref)).scalars().all()
    assert left == ["m0"]
    with pg_db.engine.begin() as connection:  # the next run finds nothing more to delete
        connection.execute(update(archive_table).values(archived_at=now))
    assert "deleted 0 dead letters" in cleanup("--archive-days", "7")


def refuse(question: str) -> bool:
    raise AssertionError(f"asked {question!r}: an archive loses nothing, so nothing is asked")


@pytest.mark.parametrize("command", [["archive"], ["purge", "--archive"]], ids=" ".join)
def test_inbox_dlq_archive_and_purge_archive_move_the_matching_dead_letters_into_the_archive(
    pg_db: Database, rabbit: Rabbit, command: list[str]
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    taken = dead_letter(rabbit, queue, ref="a")
    left = dead_letter(rabbit, queue, ref="b")
    on = ["--broker", rabbit.url, "--queue", queue, "--database-url", pg_db.url]
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(["dlq", *command, *on, "--id", taken], stdout=out, stderr=err, confirm=refuse)
    assert code == 0, err.getvalue()
    assert out.getvalue().startswith(
        f"archived 1 of 2 dead letters from {dead_letter_queue(queue)}"
    )
    (row,) = _archive.listed(pg_db.engine, archive_table)
    assert (row.ref, row.queue, row.source) == (taken, queue, "amqp")
    assert row.archived_by == getpass.getuser()
    assert [m.properties["message_id"] for m in rabbit.take_all(dead_letter_queue(queue))] == [left]


def test_a_restored_rabbitmq_letter_carries_its_headers_as_they_were(
    pg_db: Database, rabbit: Rabbit
) -> None:
    # A handler's key may be computed from a header: bytes, a time, a decimal or a table
    # must come back from the archive with their types and values, not as their text.
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    at = dt.datetime(2026, 12, 5, 9, 30, tzinfo=dt.UTC)
    kept = {
        "x-raw": b"\xff\x00key",
        "x-at": at,
        "x-amount": Decimal("12.50"),
        "x-table": {"tenant": "t1", "n": 7},
        "x-list": [1, "two"],
    }
    message_id = dead_letter(rabbit, queue, more_headers=kept)
    with open_dead_letters(rabbit.url) as source:
        moved = _archive.archive(
            source, pg_db.engine, archive_table, queue, filters=Filters(), who="ann"
        )
        assert moved.moved == 1
        (row,) = _archive.listed(pg_db.engine, archive_table)
        _archive.restore(source, pg_db.engine, archive_table, [row.id])
    (restored,) = rabbit.take_all(queue)
    assert restored.properties["message_id"] == message_id
    read_back = {**kept, "x-at": at.replace(tzinfo=None)}  # AMQP's timestamps read naive
    for name, value in read_back.items():
        assert restored.headers[name] == value, name
        assert type(restored.headers[name]) is type(value), name


def test_inbox_dlq_purge_without_archive_still_asks_and_refuses_without_a_terminal(
    rabbit: Rabbit,
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    dead_letter(rabbit, queue, ref="c")
    err = io.StringIO()
    on = ["--broker", rabbit.url, "--queue", queue]
    assert admin_main(["dlq", "purge", *on], stdout=io.StringIO(), stderr=err, confirm=None) == 2
    assert "refusing to purge without --yes" in err.getvalue()
    assert rabbit.depth(dead_letter_queue(queue)) == 1
