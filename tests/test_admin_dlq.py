"""``inbox dlq list`` and ``inbox dlq replay`` on a real RabbitMQ: poison dead-lettered by a
real ``inbox-worker`` is replayed a bounded number of times (never in a loop) with its tries
reset; filters, a dry run, and a SIGKILL in the middle of a replay (nothing lost, at most
the one message in flight in both queues)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from admin_app import AUDIT, HANDLER
from sqlalchemy import insert, select
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import (
    TESTS_DIR,
    WorkerProcess,
    declare,
    publish,
    wait_until,
    worker_command,
)

from inbox.admin import admin_main
from inbox.delivery import headers as h
from inbox.operations._dead_letters import REPLAYS
from inbox.schema import inbox_message

POISON = [f"bad-{i}" for i in range(40)]
GOOD = [f"good-{i}" for i in range(5)]


def inbox_cli(rabbit: Rabbit, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(["dlq", *argv, "--broker", rabbit.url], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def listed(rabbit: Rabbit, queue: str) -> dict[str, Any]:
    code, out, err = inbox_cli(rabbit, "list", "--queue", queue, "--limit", "1000", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def start_worker(db: Database, rabbit: Rabbit, queue: str, tmp_path: Path) -> WorkerProcess:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "admin_app:make_inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
                "--max-tries",
                "2",
                "--retry-delays",
                "0.05",
            ],
            cwd=TESTS_DIR,
            env={
                **os.environ,
                "ADMIN_APP_DATABASE_URL": db.url,
                "ADMIN_APP_POISON_FILE": str(tmp_path / "poison"),
            },
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return WorkerProcess("worker", process, log_path)


def test_poison_is_replayed_once_per_run_with_its_tries_reset_then_processed_once_fixed(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue, dlq = rabbit.queue(), f"{rabbit.queue()}.dlq"
    (tmp_path / "poison").touch()
    declare(rabbit, queue)
    publish(rabbit, queue, POISON + GOOD)
    worker = start_worker(pg_db, rabbit, queue, tmp_path)
    try:
        wait_until(lambda: rabbit.depth(dlq) == len(POISON), "the poison dead-lettered")
        first = listed(rabbit, queue)
        assert first["present"] == len(POISON)
        assert {(x["reason"], x["tries"], x["replays"]) for x in first["dead_letters"]} == {
            ("handler-failed", 2, 0)
        }
        assert rabbit.depth(dlq) == len(POISON)  # listing took nothing

        # Still poison: the worker dead-letters the copies again while the replay runs.
        code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue)
        assert code == 0
        assert (
            out == f"replayed {len(POISON)} of {len(POISON)} dead letters from {dlq} to {queue} "
            f"(read {len(POISON)}, matched {len(POISON)})\n"
        )
        wait_until(
            lambda: (
                {x["replays"] for x in listed(rabbit, queue)["dead_letters"]} == {1}
                and rabbit.depth(dlq) == len(POISON)
            ),
            "the replayed poison dead-lettered again",
        )
        again = listed(rabbit, queue)["dead_letters"]
        # Tries reset: two more tries each (kept, the first new failure would dead-letter).
        assert {x["tries"] for x in again} == {2}

        code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue, "--max-replays", "1")
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == (
            f"replayed 0 of {len(POISON)} dead letters from {dlq} to {queue} "
            f"(read {len(POISON)}, matched {len(POISON)}); left: "
            f"{len(POISON)} replayed too often already"
        )
        assert len(lines) == 1 + len(POISON)
        assert all(line.startswith("  left (replayed 1 times): id=") for line in lines[1:])
        assert rabbit.depth(dlq) == len(POISON)

        (tmp_path / "poison").unlink()  # the cause is fixed
        code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue)
        assert code == 0
        assert out.startswith(f"replayed {len(POISON)} of {len(POISON)} ")
        wait_until(lambda: len(pg_db.effect_counts()) == 2 * len(POISON + GOOD), "effects")
    finally:
        assert worker.terminate() == 0, worker.tail()
    # ops.audit committed on the first delivery and skipped every replayed copy.
    assert pg_db.effect_counts() == {
        (ref, handler): 1 for ref in POISON + GOOD for handler in (HANDLER, AUDIT)
    }
    assert rabbit.depth(dlq) == 0
    stats = worker.stats()
    assert stats["dead_lettered"] == 2 * len(POISON)


def dead_letter(
    channel: Any,
    dlq: str,
    reason: str,
    handlers: str,
    *,
    tries: int = 5,
    replays: int = 0,
    at: dt.datetime | None = None,
) -> str:
    message_id = str(uuid.uuid4())
    headers: dict[str, Any] = {
        h.TRIES: tries,
        h.REASON: reason,
        h.FAILED_HANDLERS: handlers,
        h.ERROR: "ValueError: no",
        h.SOURCE_QUEUE: dlq.removesuffix(".dlq"),
        "app-header": "kept",
    }
    if replays:
        headers[REPLAYS] = replays
    if at is not None:
        headers[h.DEAD_LETTERED_AT] = at.isoformat(timespec="milliseconds")
    channel.basic_publish_confirm(
        amqp.Message(
            b"\x00\xffraw body",
            content_type="application/octet-stream",
            message_id=message_id,
            type="op",
            delivery_mode=2,
            application_headers=headers,
        ),
        exchange="",
        routing_key=dlq,
    )
    return message_id


@pytest.fixture
def queues(rabbit: Rabbit) -> Iterator[tuple[str, str, Any]]:
    queue = rabbit.queue()
    dlq = f"{queue}.dlq"
    with rabbit.connection() as connection:
        connection.connect()
        channel = connection.connection.channel()
        for name in (queue, dlq):
            channel.queue_declare(name, durable=True, auto_delete=False)
        yield queue, dlq, channel


def test_filters_dry_run_and_what_a_replayed_copy_carries(
    rabbit: Rabbit, queues: tuple[str, str, Any]
) -> None:
    queue, dlq, channel = queues
    failed_a = dead_letter(channel, dlq, "handler-failed", "ops.a")
    unhandled = dead_letter(channel, dlq, "unhandled-type", "")
    failed_b = dead_letter(channel, dlq, "handler-failed", "ops.b,ops.c", replays=2)

    code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue, "--dry-run")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"would replay 3 of 3 dead letters from {dlq} to {queue} (read 3, matched 3)"
    # the preview lists what it would replay: id, type, reason, tries, replays, last error
    assert [line.split()[0] for line in lines[1:]] == [
        f"id={failed_a}",
        f"id={unhandled}",
        f"id={failed_b}",
    ]
    assert "reason=unhandled-type tries=5 replays=0" in lines[2]
    assert lines[3].endswith("replays=2 handlers=ops.b,ops.c error=ValueError: no")
    assert (rabbit.depth(queue), rabbit.depth(dlq)) == (0, 3)
    assert [x["message_id"] for x in listed(rabbit, queue)["dead_letters"]] == [
        failed_a,
        unhandled,
        failed_b,
    ]

    code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue, "--reason", "unhandled-type")
    assert out == (
        f"replayed 1 of 3 dead letters from {dlq} to {queue} (read 3, matched 1); left: 2 not "
        "matching the filters\n"
    )
    code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue, "--handler", "ops.c")
    assert out.startswith("replayed 1 of 2 ")
    assert [x["message_id"] for x in listed(rabbit, queue)["dead_letters"]] == [failed_a]

    copies = {m.properties["message_id"]: m for m in rabbit.take_all(queue)}
    assert set(copies) == {unhandled, failed_b}
    copy = copies[failed_b]
    assert copy.body == b"\x00\xffraw body"
    assert copy.content_type == "application/octet-stream"
    assert copy.properties["type"] == "op"
    assert copy.headers["app-header"] == "kept"
    assert copy.headers[REPLAYS] == 3
    assert not {h.TRIES, h.REASON, h.ERROR, h.FAILED_HANDLERS} & set(copy.headers)

    code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue, "--keep-tries", "--limit", "1")
    assert out == f"replayed 1 of 1 dead letters from {dlq} to {queue} (read 1, matched 1)\n"
    [kept] = rabbit.take_all(queue)
    assert kept.headers[h.TRIES] == 5
    assert kept.headers[REPLAYS] == 1


def test_a_missing_dead_letter_queue_is_one_line(rabbit: Rabbit) -> None:
    code, out, err = inbox_cli(rabbit, "list", "--queue", rabbit.queue("absent"))

    assert code == 1
    assert out == ""
    assert err.startswith("inbox: error: broker amqp://guest:***@")
    assert "NOT_FOUND" in err
    assert err.count("\n") == 1


def admin_command() -> list[str]:
    script = Path(sys.executable).with_name("inbox")
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from inbox.admin import admin_main; sys.exit(admin_main())",
    ]


@pytest.mark.slow
def test_a_replay_killed_midway_loses_nothing_and_doubles_at_most_one(
    rabbit: Rabbit, queues: tuple[str, str, Any], tmp_path: Path
) -> None:
    queue, dlq, channel = queues
    ids = {dead_letter(channel, dlq, "handler-failed", "ops.a") for _ in range(3000)}
    log_path = tmp_path / "replay.log"
    with log_path.open("wb") as log:
        replay = subprocess.Popen(
            [*admin_command(), "dlq", "replay", "--queue", queue, "--broker", rabbit.url],
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(lambda: rabbit.depth(queue) >= 300 or replay.poll() is not None, "a replay")
        replay.send_signal(signal.SIGKILL)
        assert replay.wait(30) == -signal.SIGKILL, "the replay ended before it was killed"
    finally:
        if replay.poll() is None:
            replay.kill()
    # The broker requeues what the killed replay held unacked once it sees the socket close.
    wait_until(lambda: rabbit.depth(queue) + rabbit.depth(dlq) >= len(ids), "the requeue")

    assert 300 <= rabbit.depth(queue) < len(ids)

    # Run again: it takes up where the killed run stopped.
    code, out, _ = inbox_cli(rabbit, "replay", "--queue", queue)

    assert code == 0
    assert out.startswith("replayed ")
    assert rabbit.depth(dlq) == 0
    in_queue = [m.properties["message_id"] for m in rabbit.take_all(queue)]
    assert set(in_queue) == ids  # nothing lost
    assert len(in_queue) - len(ids) <= 1  # at most the message in flight at the kill twice


def test_listing_a_quorum_dead_letter_queue_again_and_again_keeps_every_message(
    rabbit: Rabbit,
) -> None:
    # A quorum queue counts every return of a message held unacked (x-delivery-count) and,
    # from RabbitMQ 4.0 on, drops it past its delivery limit (20 by default).
    queue = rabbit.queue("quorum")
    dlq = f"{queue}.dlq"
    with rabbit.connection() as connection:
        connection.connect()
        channel = connection.connection.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
        channel.queue_declare(
            dlq, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )
        ids = [dead_letter(channel, dlq, "handler-failed", "ops.a") for _ in range(3)]

    for _ in range(25):
        # A quorum queue takes back what a closed channel held asynchronously: its count
        # (which bounds a listing) can lag for a moment.
        wait_until(lambda: rabbit.depth(dlq) == len(ids), "the returns")
        assert {x["message_id"] for x in listed(rabbit, queue)["dead_letters"]} == set(ids)

    wait_until(lambda: rabbit.depth(dlq) == len(ids), "the returns")
    kept = rabbit.take_all(dlq)
    assert sorted(m.properties["message_id"] for m in kept) == sorted(ids)
    assert all(m.headers.get("x-delivery-count", 0) < 10 for m in kept)
    assert all(m.body == b"\x00\xffraw body" and m.headers[h.TRIES] == 5 for m in kept)


def test_status_shows_the_dead_letter_queue_depth(
    pg_db: Database, rabbit: Rabbit, queues: tuple[str, str, Any]
) -> None:
    queue, dlq, channel = queues
    for _ in range(2):
        dead_letter(channel, dlq, "handler-failed", "ops.a")
    out, err = io.StringIO(), io.StringIO()

    code = admin_main(
        ["status", "--database-url", pg_db.url, "--broker", rabbit.url, "--queue", queue],
        stdout=out,
        stderr=err,
    )

    assert (code, err.getvalue()) == (0, "")
    assert out.getvalue().splitlines()[-1] == f"dead letters in {dlq}: 2"


def test_show_purge_and_the_age_filter(rabbit: Rabbit, queues: tuple[str, str, Any]) -> None:
    queue, dlq, channel = queues
    now = dt.datetime.now(dt.UTC)
    old = dead_letter(channel, dlq, "handler-failed", "ops.a", at=now - dt.timedelta(hours=2))
    new = dead_letter(channel, dlq, "unhandled-type", "", at=now)
    old_at = (now - dt.timedelta(hours=2)).isoformat(timespec="milliseconds")

    code, out, _ = inbox_cli(rabbit, "show", "--queue", queue, old)
    assert code == 0
    lines = out.splitlines()
    assert f"message_id: {old}" in lines
    assert "header x-inbox-reason: handler-failed" in lines
    assert lines[-2:] == [
        "body (10 bytes, base64):",
        base64.b64encode(b"\x00\xffraw body").decode(),
    ]
    code, out, _ = inbox_cli(rabbit, "show", "--queue", queue, str(uuid.uuid4()))
    assert code == 3
    wait_until(lambda: rabbit.depth(dlq) == 2, "the dead letters back in place")

    code, _, err = inbox_cli(rabbit, "purge", "--queue", queue, "--older-than", "1h")
    assert (code, err) == (
        2,
        "inbox: error: refusing to purge without --yes (no terminal to ask on)\n",
    )
    code, out, _ = inbox_cli(rabbit, "purge", "--queue", queue, "--older-than", "1h", "--dry-run")
    assert out.splitlines() == [
        f"would purge 1 of 2 dead letters from {dlq} (read 2, matched 1); left: 1 not matching "
        "the filters",
        f"  id={old} type=op reason=handler-failed tries=5 replays=0 at={old_at} handlers=ops.a "
        "error=ValueError: no",
    ]
    wait_until(lambda: rabbit.depth(dlq) == 2, "the dead letters back in place")

    code, out, _ = inbox_cli(rabbit, "purge", "--queue", queue, "--older-than", "1h", "--yes")

    assert code == 0
    assert out == (
        f"purged 1 of 2 dead letters from {dlq} (read 2, matched 1); left: 1 not matching the "
        "filters\n"
    )
    assert [x["message_id"] for x in listed(rabbit, queue)["dead_letters"]] == [new]
    code, _, err = inbox_cli(rabbit, "purge", "--queue", queue, "--older-than", "soon")
    assert code == 2
    assert "expected a duration like 30m, 12h or 7d, got 'soon'" in err


def uuid7_at(moment: dt.datetime) -> str:
    millis = int(moment.timestamp() * 1000)
    raw = bytearray(millis.to_bytes(6, "big") + uuid.uuid4().bytes[6:])
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(raw)))


def test_cleanup_keeps_the_claims_a_dead_letter_may_still_need(
    pg_db: Database, rabbit: Rabbit, queues: tuple[str, str, Any]
) -> None:
    queue, dlq, channel = queues
    now = dt.datetime.now(dt.UTC)
    sent = now - dt.timedelta(days=10, hours=1)
    letter_id = uuid7_at(sent)
    channel.basic_publish_confirm(
        amqp.Message(b"{}", message_id=letter_id, application_headers={h.REASON: "handler-failed"}),
        exchange="",
        routing_key=dlq,
    )
    with pg_db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [
                {
                    "message_id": uuid.uuid4(),
                    "handler": f"h{age}",
                    "processed_at": now - dt.timedelta(days=age),
                }
                for age in (2, 9, 10, 13)
            ],
        )
    out, err = io.StringIO(), io.StringIO()

    code = admin_main(
        [
            "cleanup",
            "--days",
            "3",
            "--database-url",
            pg_db.url,
            "--broker",
            rabbit.url,
            "--queue",
            queue,
        ],
        stdout=out,
        stderr=err,
    )

    assert (code, err.getvalue()) == (0, "")
    lines = out.getvalue().splitlines()
    sent_ms = dt.datetime.fromtimestamp(int(sent.timestamp() * 1000) / 1000, dt.UTC)
    assert lines[0] == (
        f"inbox cleanup: keeping the claims of the last 12 days, not 3: the oldest dead letter "
        f"in {dlq} (message {letter_id}) was first sent at "
        f"{sent_ms.isoformat(timespec='seconds')} and may still be replayed"
    )
    assert lines[1].startswith("inbox-cleanup: deleted 1 claims ")
    with pg_db.engine.connect() as connection:
        kept = set(connection.execute(select(inbox_message.c.handler)).scalars())
    assert kept == {"h2", "h9", "h10"}
    wait_until(lambda: rabbit.depth(dlq) == 1, "the dead letter back in place")

    # Without --queue, inbox cleanup is inbox-cleanup.
    code = admin_main(["cleanup", "--days", "3", "--database-url", pg_db.url, "-q"])
    assert code == 0
    with pg_db.engine.connect() as connection:
        assert set(connection.execute(select(inbox_message.c.handler)).scalars()) == {"h2"}


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_and_quiet(rabbit: Rabbit, queues: tuple[str, str, Any]) -> None:
    queue, dlq, channel = queues
    for _ in range(150):
        dead_letter(channel, dlq, "handler-failed", "ops.a")
    out, err = io.StringIO(), Terminal()

    code = admin_main(
        ["dlq", "replay", "--queue", queue, "--broker", rabbit.url, "--limit", "120"],
        stdout=out,
        stderr=err,
    )

    assert code == 0
    assert err.getvalue() == "\r100/150 read, 100 taken\r120/150 read, 120 taken\n"
    assert out.getvalue().startswith("replayed 120 of 150 dead letters")
    assert out.getvalue().endswith("left: 30 not read (--limit 120 reached)\n")

    out, err = io.StringIO(), Terminal()
    code = admin_main(
        ["dlq", "replay", "--queue", queue, "--broker", rabbit.url, "--quiet"],
        stdout=out,
        stderr=err,
    )
    assert (code, out.getvalue(), err.getvalue()) == (0, "", "")
    assert rabbit.depth(queue) == 150


def test_limit_counts_the_matching_dead_letters_and_max_read_bounds_the_reading(
    rabbit: Rabbit, queues: tuple[str, str, Any]
) -> None:
    """Issue 32 item 8: ``--reason R --limit N`` replays N matching letters even when
    letters of other reasons come first; ``--max-read`` still bounds what is read."""
    queue, dlq, channel = queues
    wanted = []
    for i in range(20):
        if i % 4 == 3:  # the 4th, 8th, ... letters: the matching ones come late
            wanted.append(dead_letter(channel, dlq, "handler-failed", "ops.a"))
        else:
            dead_letter(channel, dlq, "unhandled-type", "")

    code, out, err = inbox_cli(
        rabbit, "replay", "--queue", queue, "--reason", "handler-failed", "--limit", "2"
    )
    assert code == 0, err
    assert out == (
        f"replayed 2 of 20 dead letters from {dlq} to {queue} (read 8, matched 2); left: "
        "6 not matching the filters, 12 not read (--limit 2 reached)\n"
    )
    assert [m.properties["message_id"] for m in rabbit.take_all(queue)] == wanted[:2]

    code, out, err = inbox_cli(
        rabbit,
        "purge",
        "--queue",
        queue,
        "--reason",
        "handler-failed",
        "--limit",
        "5",
        "--max-read",
        "10",
        "--dry-run",
    )
    assert code == 0, err
    assert out.splitlines()[0] == (
        f"would purge 1 of 18 dead letters from {dlq} (read 10, matched 1); left: "
        "9 not matching the filters, 8 not read (--max-read 10)"
    )
    assert out.splitlines()[1].startswith(f"  id={wanted[2]} ")
    wait_until(lambda: rabbit.depth(dlq) == 18, "the dead letters back in place")


def test_replay_and_purge_take_only_the_chosen_message_ids(rabbit: Rabbit) -> None:
    from console_support import dead_letter, declare_queues

    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    first, second, third = (dead_letter(rabbit, queue, ref=r) for r in ("a", "b", "c"))

    code, out, err = inbox_cli(rabbit, "replay", "--queue", queue, "--id", first)
    assert code == 0, err
    assert "replayed 1 of 3 dead letters" in out
    assert "2 not matching the filters" in out
    assert [m.properties["message_id"] for m in rabbit.take_all(queue)] == [first]
    code, out, err = inbox_cli(
        rabbit, "purge", "--queue", queue, "--id", second, "--id", "nope", "--yes"
    )
    assert code == 0, err
    assert "purged 1 of 2" in out
    left = [m.properties["message_id"] for m in rabbit.take_all(f"{queue}.dlq")]
    assert left == [third]
