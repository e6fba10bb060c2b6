"""The console's failure groups in a real headless Chromium (issue 34 item 1), on PostgreSQL
and RabbitMQ with a real worker: dead letters that failed the same way (the same handler and
exception, the error text alike but for its ids and numbers) are one group with its count and
a sample; a group is replayed through the preview and the confirmation, and the worker then
processes exactly that group's messages while the other group stays dead-lettered.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence the F811)."""

# ruff: noqa: F811

from __future__ import annotations

from pathlib import Path

from console_support import settings
from selenium.webdriver.common.by import By
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.operations._dead_letters import dead_letter_queue


def failing_app(db: Database, fixed: list[bool]) -> Inbox:
    """``ops.apply``: orders whose number is odd are "not found" (a different number in each
    error), the others' cards are declined; until ``fixed[0]``."""
    inbox = Inbox(sessionmaker(db.engine))

    def apply(message: Message, session: Session) -> None:
        number = int(str(message.body["ref"]).removeprefix("order-"))
        if not fixed[0]:
            if number % 2:
                raise LookupError(f"order {number} not found in shard {number * 7}")
            raise ValueError("card declined by the provider")
        record_effect(message, session, "ops.apply")

    inbox.handler("op", name="ops.apply")(apply)
    return inbox


def raised_at(statement: str) -> str:
    """``module:function:line`` of the line of ``apply`` in :func:`failing_app` that holds
    ``statement``: the frame the worker records for a failure raised there."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    (line,) = [n for n, text in enumerate(lines, start=1) if text.strip().startswith(statement)]
    return f"{__name__}:apply:{line}"


def group_rows(page: Page) -> list[list[str]]:
    page.find("#groups")
    return [
        [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")]
        for row in page.browser.find_elements(By.CSS_SELECTOR, "tr.group-row")
    ]


def test_dead_letters_are_grouped_by_failure_and_a_group_is_replayed(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("orders")
    fixed = [False]
    worker = Worker(
        failing_app(pg_db, fixed), rabbit.url, [queue], retry=RetryPolicy((0.1,), max_tries=1)
    )
    worker.prepare()
    thread = run_in_thread(worker)
    try:
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            for n in (1, 2, 3, 5):
                publisher.publish("op", {"ref": f"order-{n}"})
        wait_until(lambda: rabbit.depth(dead_letter_queue(queue)) == 4, "four dead letters")
        fixed[0] = True  # the lookup is fixed; the declined cards are not
        console.serve(settings(pg_db, rabbit, (queue,)))

        page.sign_in()
        wait_until(lambda: "/login" not in page.browser.current_url, "signed in", timeout=10)
        page.open(f"/dead-letters?queue={queue}")
        page.click("#to-groups")
        rows = group_rows(page)
        assert page.text("#group-count") == "2"
        not_found, declined = rows  # the largest group first
        # The error, and under it where the handler raised it (x-inbox-error-frame).
        assert not_found[1:6] == [
            "3",
            "handler-failed",
            "ops.apply",
            "LookupError",
            f"order <n> not found in shard <n>\nops.apply@{raised_at('raise LookupError(')}",
        ]
        assert declined[1:6] == [
            "1",
            "handler-failed",
            "ops.apply",
            "ValueError",
            f"card declined by the provider\nops.apply@{raised_at('raise ValueError(')}",
        ]
        page.shot("failure-groups")

        page.click("#replay-group-1")
        assert "would replay 3 of 4" in page.text("#preview")
        listed = page.text("#taken")
        assert "LookupError" in listed
        assert "ValueError" not in listed
        page.click("#confirm")
        assert "replayed 3 of 4" in page.text("#outcome")
        wait_until(lambda: len(pg_db.effect_counts()) == 3, "the group's three orders")
        assert sorted(ref for ref, _ in pg_db.effect_counts()) == ["order-1", "order-3", "order-5"]
        assert rabbit.depth(dead_letter_queue(queue)) == 1  # the declined card stays

        page.open(f"/dead-letters/groups?queue={queue}")
        (left,) = group_rows(page)
        assert left[4] == "ValueError"
    finally:
        worker.stop()
        thread.join(timeout=30)
