"""The console and ``inbox status --queue`` on a Celery app's dead letters on Redis (issue 31
item 7): the dead-letter pages list, show, replay and purge the ``<queue>.dlq`` lists of
kombu's Redis transport through the same operations as ``inbox dlq --broker redis://``."""

from __future__ import annotations

import datetime as dt
import io
import json

from console_support import TOKEN, confirmation, csrf_of, tables
from kombu import Connection, Queue
from starlette.testclient import TestClient
from support.databases import Database
from support.redis import REDIS_URL, redis_area

from inbox.admin.cli import admin_main
from inbox.console import ConsoleSettings, Credentials, create_app
from inbox.delivery import headers as h
from inbox.operations._dead_letters import REPLAYS

BROKER = REDIS_URL.rsplit("/", 1)[0] + "/5"


def celery_letter(url: str, queue: str, task_id: str, reason: str, error: str) -> None:
    """A Celery task's dead letter as the inbox's Celery integration pushes it on Redis."""
    headers = {
        "id": task_id,
        "task": "app.tasks.charge",
        h.REASON: reason,
        h.TRIES: 2,
        h.ERROR: error,
        h.FAILED_HANDLERS: "app.tasks.charge",
        h.SOURCE_QUEUE: queue,
        h.DEAD_LETTERED_AT: dt.datetime.now(dt.UTC).isoformat(),
    }
    dead = f"{queue}.dlq"
    with Connection(url) as connection:
        connection.Producer().publish(
            [["order-7"], {}, {}],
            routing_key=dead,
            headers=headers,
            declare=[Queue(dead, routing_key=dead)],
        )


def test_the_console_lists_shows_replays_and_purges_celery_dead_letters_on_redis(
    pg_db: Database,
) -> None:
    with redis_area(BROKER) as area:
        queue = area.stream("celery")
        celery_letter(area.url, queue, "task-a", "handler-failed", "ValueError: card 7 declined")
        celery_letter(area.url, queue, "task-b", "invalid-body", "undecodable body")
        console = ConsoleSettings(
            pg_db.engine,
            tables(),
            Credentials(token=TOKEN),
            area.url,
            (queue,),
            allow_actions=True,
            allow_hard_purge=True,
        )
        client = TestClient(create_app(console), base_url="http://127.0.0.1:8765")
        assert client.post("/login", data={"token": TOKEN}).status_code == 200

        listing = client.get(f"/dead-letters?queue={queue}")
        assert listing.status_code == 200, listing.text
        assert "task-a" in listing.text
        assert "task-b" in listing.text
        assert "app.tasks.charge" in listing.text
        assert "invalid-body: 1" in listing.text
        assert 'id="dlq-depth-1">2<' in client.get("/").text

        shown = client.get(f"/dead-letters/message?queue={queue}&id=task-a")
        assert shown.status_code == 200, shown.text
        assert "card 7 declined" in shown.text
        assert "order-7" in shown.text  # the task's arguments: the body

        csrf = csrf_of(listing.text)
        preview = client.post(
            "/dead-letters/replay", data={"csrf": csrf, "queue": queue, "id": "task-a"}
        )
        assert "would replay 1 of 2 dead letters" in preview.text
        with area.client() as redis_client:
            assert redis_client.llen(queue) == 0  # a preview moves nothing
        done = client.post("/dead-letters/replay", data=confirmation(preview.text))
        assert "replayed 1 of 2 dead letters" in done.text
        with area.client() as redis_client:
            (replayed,) = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
            assert replayed["headers"]["id"] == "task-a"  # still a Celery task message
            assert replayed["headers"][REPLAYS] == 1
            assert h.REASON not in replayed["headers"]
            assert redis_client.llen(f"{queue}.dlq") == 1

        asked = client.post(
            "/dead-letters/purge", data={"csrf": csrf, "queue": queue, "reason": "invalid-body"}
        )
        assert "would purge 1 of 1" in asked.text
        purged = client.post("/dead-letters/purge", data=confirmation(asked.text))
        assert "purged 1 of 1" in purged.text
        with area.client() as redis_client:
            assert redis_client.llen(f"{queue}.dlq") == 0


def test_inbox_status_counts_the_dead_letters_of_redis_queues(pg_db: Database) -> None:
    with redis_area(BROKER) as area:
        queue, empty = area.stream("celery"), area.stream("quiet")
        celery_letter(area.url, queue, "task-a", "handler-failed", "ValueError: no")
        celery_letter(area.url, queue, "task-b", "handler-failed", "ValueError: no")
        out = io.StringIO()
        argv = ["status", "--database-url", pg_db.url, "--broker", area.url, "--json"]
        code = admin_main(
            [*argv, "--queue", queue, "--queue", empty], stdout=out, stderr=io.StringIO()
        )
        assert code == 0, out.getvalue()
        report = json.loads(out.getvalue())
        # A list Redis does not have is an empty one.
        assert report["dead_letters"] == {f"{queue}.dlq": 2, f"{empty}.dlq": 0}
