"""The dead-letter archive in a real headless Chromium (issue 34 item 4), on PostgreSQL and
RabbitMQ: a dead letter archived (not deleted) from its page after a preview and a
confirmation, listed on the archive page with who archived it, restored to its queue as a
replay (tries reset, the replay counted), and hard purge offered only by a console started
with ``--allow-hard-purge``.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence the F811)."""

# ruff: noqa: F811

from __future__ import annotations

import uuid

from console_support import TOKEN, dead_letter, declare_queues, settings, tables
from selenium.webdriver.common.by import By
from sqlalchemy import select
from starlette.testclient import TestClient
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401

from inbox.console import create_app
from inbox.delivery import headers as h
from inbox.operations._dead_letters import REPLAYS, dead_letter_queue
from inbox.schema import inbox_dead_letter_archive


def test_a_dead_letter_is_archived_listed_and_restored_to_its_queue(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("archived")
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue, error="ops.apply: ValueError: card declined")
    kept = dead_letter(rabbit, queue, ref="other")
    console.serve(settings(pg_db, rabbit, (queue,), allow_hard_purge=False))

    page.sign_in()
    wait_until(lambda: "/login" not in page.browser.current_url, "signed in", timeout=10)
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    assert not page.browser.find_elements(By.CSS_SELECTOR, "#purge-one")  # no hard purge
    page.click("#archive-one")
    assert "would archive 1 of 2" in page.text("#preview")
    assert rabbit.depth(dead_letter_queue(queue)) == 2  # a preview moves nothing
    page.click("#confirm")
    assert "archived 1 of 2 dead letters" in page.text("#outcome")
    assert rabbit.depth(dead_letter_queue(queue)) == 1

    page.link("Archive")
    assert page.text("#archive-total") == "1"
    row = page.find("tr.archived-row")
    assert message_id in row.text
    assert "token" in row.text  # who archived it
    assert "card declined" in row.text
    page.shot("archive")
    assert page.browser.find_elements(By.CSS_SELECTOR, "#restore-selected")
    assert not page.browser.find_elements(By.CSS_SELECTOR, "#delete-selected")  # a purge

    page.click("input.pick[value]")
    page.click("#restore-selected")
    assert "would restore 1 of the 1 chosen" in page.text("#preview")
    page.click("#confirm")
    assert "restored 1 of 1 archived dead letters" in page.text("#outcome")

    (restored,) = rabbit.take_all(queue)
    assert restored.properties["message_id"] == message_id
    assert restored.headers[REPLAYS] == 1
    assert h.TRIES not in restored.headers  # tries reset, as a replay
    assert h.REASON not in restored.headers
    with pg_db.engine.connect() as connection:
        assert connection.execute(select(inbox_dead_letter_archive.c.id)).all() == []
    assert rabbit.depth(dead_letter_queue(queue)) == 1  # the other one never moved
    assert kept != message_id

    # Without --allow-hard-purge a purge is refused, even posted by hand.
    client = TestClient(create_app(settings(pg_db, rabbit, (queue,), allow_hard_purge=False)))
    signed = client.post("/login", data={"token": TOKEN})
    csrf = signed.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    refused = client.post("/dead-letters/purge", data={"csrf": csrf, "queue": queue})
    assert refused.status_code == 403
    assert "archive instead" in refused.text
    assert rabbit.depth(dead_letter_queue(queue)) == 1
    # Archive then delete is a purge: deleting archived letters is gated the same way.
    gone = client.post("/archive/delete", data={"csrf": csrf, "id": str(uuid.uuid4())})
    assert gone.status_code == 403
    assert "--allow-hard-purge" in gone.text
    hard = TestClient(create_app(settings(pg_db, rabbit, (queue,), allow_hard_purge=True)))
    signed = hard.post("/login", data={"token": TOKEN})
    csrf = signed.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    asked = hard.post("/archive/delete", data={"csrf": csrf, "id": str(uuid.uuid4())})
    assert asked.status_code == 200
    assert "delete 0 archived dead letters?" in asked.text


def test_tables_carry_the_default_archive(pg_db: Database) -> None:
    assert tables().archive is inbox_dead_letter_archive
    assert tables().in_schema("tenant_a").archive.schema == "tenant_a"
