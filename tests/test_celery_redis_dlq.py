"""``inbox dlq list|show|replay|purge`` on the dead letters of Celery tasks on Redis (kombu's
Redis transport): a real prefork worker dead-letters them, the command reads them without
taking them, a replayed one is a Celery task message the worker runs once, a purge deletes
only what its filter names."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from support.databases import Database
from support.redis import REDIS_URL, redis_area
from test_celery_worker import sender, until, worker

from inbox.admin.cli import admin_main
from inbox.operations import _redis_dead_letters
from inbox.operations._dead_letters import REPLAYS

BROKER = REDIS_URL.rsplit("/", 1)[0] + "/5"


def dlq(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = admin_main(["dlq", *argv], stdout=out, stderr=io.StringIO())
    return code, out.getvalue()


def test_inbox_dlq_lists_shows_replays_and_purges_celery_dead_letters_on_redis(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        redis_area(BROKER) as area,
        sender(area.url, area.stream("celery"), pg_db, monkeypatch) as app,
    ):
        queue = area.stream("celery")
        dead = f"{queue}.dlq"
        (tmp_path / "fail-bad").touch()
        fragile = app.fragile.delay("bad")
        poison = app.strict.delay("not-a-mapping")
        with worker(area.url, queue, pg_db, tmp_path), area.client() as client:
            until(lambda: client.llen(dead) == 2, "two dead letters")
        on = ["--broker", area.url, "--queue", queue]

        code, listed = dlq("list", *on)
        assert code == 0
        first, *lines = listed.splitlines()
        assert first == f"2 dead letters in {dead}"
        by_id = {line.split()[0]: line for line in lines}
        assert "type=ct.fragile reason=handler-failed tries=2" in by_id[f"id={fragile.id}"]
        assert "type=ct.strict reason=invalid-key" in by_id[f"id={poison.id}"]

        code, shown = dlq("show", *on, fragile.id)
        assert code == 0
        assert "header x-inbox-reason: handler-failed" in shown
        assert f"header x-inbox-queue: {queue}" in shown
        assert '[["bad"], {}' in shown  # the protocol-2 body: args, kwargs, embed
        assert dlq("show", *on, "no-such-id")[0] == 3

        with area.client() as client:
            assert client.llen(dead) == 2, "list and show took nothing"
        code, replayed = dlq("replay", *on, "--reason", "handler-failed")
        assert code == 0
        assert replayed == (
            f"replayed 1 of 2 dead letters from {dead} to {queue} (read 2, matched 1); left: 1 "
            "not matching the filters\n"
        )
        with area.client() as client:
            assert client.llen(dead) == 1
            [raw] = client.lrange(queue, 0, -1)
        headers = json.loads(raw)["headers"]
        assert headers["x-inbox-replays"] == 1
        assert "x-inbox-reason" not in headers
        assert headers["id"] == fragile.id

        (tmp_path / "fail-bad").unlink()
        with worker(area.url, queue, pg_db, tmp_path):
            until(lambda: pg_db.effect_counts() == {("bad", "ct.fragile"): 1}, "the replayed task")

        assert dlq("purge", *on, "--reason", "handler-failed", "--yes", "-q")[0] == 0
        with area.client() as client:
            assert client.llen(dead) == 1, "the purge's filter left the invalid-key letter"
        assert dlq("purge", *on, "--reason", "invalid-key", "--yes", "-q")[0] == 0
        with area.client() as client:
            assert client.llen(dead) == 0
        assert pg_db.effect_counts() == {("bad", "ct.fragile"): 1}


def test_a_redis_replay_keeps_what_was_replayed_too_often_and_a_dry_run_or_limit_moves_less() -> (
    None
):
    with redis_area(BROKER) as area, area.client() as client:
        queue = area.stream("q")
        dead = f"{queue}.dlq"
        with Connection(area.url) as connection:
            producer = connection.Producer()
            for n, replays in enumerate((0, 3, 0)):
                producer.publish(
                    {"n": n},
                    routing_key=dead,
                    headers={"id": f"m{n}", "x-inbox-reason": "handler-failed", REPLAYS: replays},
                    declare=[Queue(dead, routing_key=dead)],
                )
        client.lpush(dead, b"\xff not an envelope")  # shown, never taken by a reason filter
        on = ["--broker", area.url, "--queue", queue]
        code, listed = dlq("list", *on)
        assert code == 0
        assert listed.splitlines()[0] == f"4 dead letters in {dead}"
        replay = ["replay", *on, "--reason", "handler-failed"]
        assert dlq(*replay, "--dry-run")[1].startswith("would replay 2 of 4")
        assert client.llen(dead) == 4
        assert dlq(*replay, "--limit", "1")[1].startswith("replayed 1 of 4")
        code, out = dlq(*replay)
        assert out.startswith("replayed 1 of 3")
        assert "left (replayed 3 times): id=m1" in out
        assert client.llen(dead) == 2
        moved = [json.loads(raw)["headers"]["id"] for raw in reversed(client.lrange(queue, 0, -1))]
        assert moved == ["m0", "m2"]  # oldest first, as they were dead-lettered


def letters(area_url: str, dead: str, *heads: dict[str, object]) -> None:
    """Dead letters as kombu's Redis transport pushes them, oldest first."""
    with Connection(area_url) as connection:
        producer = connection.Producer()
        for n, headers in enumerate(heads):
            producer.publish(
                {"n": n},
                routing_key=dead,
                headers=headers,
                declare=[Queue(dead, routing_key=dead)],
            )


def dlq_asked(*argv: str, answer: bool | None) -> tuple[int, str, str, list[str]]:
    """``inbox dlq`` with a terminal answering ``answer`` (None: no terminal)."""
    out, err = io.StringIO(), io.StringIO()
    asked: list[str] = []

    def confirm(question: str) -> bool:
        asked.append(question)
        return bool(answer)

    code = admin_main(
        ["dlq", *argv], stdout=out, stderr=err, confirm=None if answer is None else confirm
    )
    return code, out.getvalue(), err.getvalue(), asked


def test_redis_limit_counts_matching_letters_max_read_bounds_reading_and_purge_lists_first() -> (
    None
):
    """The operator's options on Redis, through the same replay and purge as on RabbitMQ."""
    with redis_area(BROKER) as area, area.client() as client:
        queue = area.stream("q")
        dead = f"{queue}.dlq"
        other = {"x-inbox-reason": "unhandled-type"}
        letters(
            area.url,
            dead,
            {**other, "id": "o0"},
            {**other, "id": "o1"},
            {"x-inbox-reason": "handler-failed", "id": "m0"},
            {"x-inbox-reason": "handler-failed", "id": "m1"},
            {**other, "id": "o2"},
            {"x-inbox-reason": "handler-failed", "id": "m2"},
        )
        on = ["--broker", area.url, "--queue", queue, "--reason", "handler-failed"]

        code, out = dlq("replay", *on, "--limit", "2", "--dry-run")
        assert code == 0
        first, *taken = out.splitlines()
        assert first == (
            f"would replay 2 of 6 dead letters from {dead} to {queue} (read 4, matched 2); "
            "left: 2 not matching the filters, 2 not read (--limit 2 reached)"
        )
        assert [line.split()[0] for line in taken] == ["id=m0", "id=m1"]
        assert client.llen(dead) == 6

        code, out = dlq("replay", *on, "--max-read", "3")
        assert out == (
            f"replayed 1 of 6 dead letters from {dead} to {queue} (read 3, matched 1); left: "
            "2 not matching the filters, 3 not read (--max-read 3)\n"
        )
        assert [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)] == ["m0"]

        code, out, err, asked = dlq_asked("purge", *on, answer=None)
        assert (code, err) == (
            2,
            "inbox: error: refusing to purge without --yes (no terminal to ask on)\n",
        )
        first, *taken = out.splitlines()
        assert first.startswith(f"would purge 2 of 5 dead letters from {dead} (read 5, matched 2)")
        assert [line.split()[0] for line in taken] == ["id=m1", "id=m2"]
        assert client.llen(dead) == 5

        code, out, err, asked = dlq_asked("purge", *on, answer=True)
        assert code == 0, err
        assert asked == [f"delete these dead letters of {dead} for good?"]
        assert out.splitlines()[-1].startswith(f"purged 2 of 5 dead letters from {dead}")
        ids = [json.loads(raw)["headers"]["id"] for raw in client.lrange(dead, 0, -1)]
        assert sorted(ids) == ["o0", "o1", "o2"]


def test_redis_dead_letters_without_an_id_are_named_by_sha256_and_moved_one_by_one() -> None:
    with redis_area(BROKER) as area, area.client() as client:
        queue = area.stream("q")
        dead = f"{queue}.dlq"
        failed = {"x-inbox-reason": "handler-failed"}
        letters(area.url, dead, failed, failed, failed)  # {"n": 0}, {"n": 1}, {"n": 2}
        client.lpush(dead, b"\xff not an envelope")
        on = ["--broker", area.url, "--queue", queue]

        code, out = dlq("list", *on, "--json")
        assert code == 0
        refs = [x["ref"] for x in json.loads(out)["dead_letters"]]
        assert all(r.startswith("sha256:") and len(r) == 7 + 16 for r in refs)
        assert len(set(refs)) == 4
        assert dlq("list", *on)[1].splitlines()[1].startswith(f"ref={refs[0]} ")

        code, out = dlq("show", *on, refs[1])
        assert code == 0
        assert out.splitlines()[-1] == '{"n": 1}'
        code, out = dlq("show", *on, refs[3])
        assert code == 0
        assert "not an envelope" in out

        code, out = dlq("replay", *on, "--id", refs[1])
        assert out.startswith(
            f"replayed 1 of 4 dead letters from {dead} to {queue} (read 4, matched 1)"
        )
        [raw] = client.lrange(queue, 0, -1)
        assert json.loads(raw)["headers"]["x-inbox-replays"] == 1

        code, out = dlq("purge", *on, "--id", refs[3], "--yes")
        assert out.startswith(f"purged 1 of 3 dead letters from {dead} (read 3, matched 1)")
        code, out = dlq("list", *on, "--json")
        assert [x["ref"] for x in json.loads(out)["dead_letters"]] == [refs[0], refs[2]]


def test_a_redis_dead_letter_list_longer_than_a_page_is_read_a_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``list --limit N`` reads N entries, ``show``, replay and purge read pages of
    :data:`PAGE` (3 here, in a list of 11) and take the right ones across page boundaries."""
    replies: list[int] = []
    lrange = redis.Redis.lrange

    def recorded(self: redis.Redis, name: str, start: int, end: int) -> Any:
        reply = lrange(self, name, start, end)
        replies.append(len(reply))
        return reply

    monkeypatch.setattr(_redis_dead_letters, "PAGE", 3, raising=False)
    with redis_area(BROKER) as area, area.client() as client:
        queue = area.stream("q")
        dead = f"{queue}.dlq"
        wanted = {"x-inbox-reason": "handler-failed"}
        other = {"x-inbox-reason": "unhandled-type"}
        heads = [{**(wanted if n % 2 else other), "id": f"l{n}"} for n in range(11)]
        letters(area.url, dead, *heads)
        monkeypatch.setattr(redis.Redis, "lrange", recorded)
        on = ["--broker", area.url, "--queue", queue]

        code, out = dlq("list", *on, "--limit", "2")
        assert code == 0
        assert [line.split()[0] for line in out.splitlines()[1:]] == ["id=l0", "id=l1"]
        assert replies == [2]

        replies.clear()
        code, out = dlq("show", *on, "l10")
        assert code == 0
        assert "header id: l10\n" in out
        assert replies == [3, 3, 3, 2]  # the oldest last

        replies.clear()
        code, out = dlq("replay", *on, "--reason", "handler-failed", "--limit", "3")
        assert out.startswith(f"replayed 3 of 11 dead letters from {dead} to {queue} (read 6,")
        assert max(replies) <= 3
        replayed = [json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1)]
        assert replayed == ["l5", "l3", "l1"]  # pushed on the left: the newest first

        replies.clear()
        code, out = dlq("purge", *on, "--reason", "unhandled-type", "--yes")
        assert out.startswith(f"purged 6 of 8 dead letters from {dead} (read 8, matched 6)")
        assert max(replies) <= 3
        left = [json.loads(raw)["headers"]["id"] for raw in reversed(client.lrange(dead, 0, -1))]
        assert left == ["l7", "l9"]
