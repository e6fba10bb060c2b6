"""The console's audit page in a real headless Chromium (issue 34 item 3), on PostgreSQL and
RabbitMQ: a person signed in with a user name and password replays a dead letter; the audit
page names them, the action, its count and its queue, and filters by who, action, age and a
text of the details.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence the F811)."""

# ruff: noqa: F811

from __future__ import annotations

from console_support import PASSWORD, dead_letter, declare_queues, settings
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401


def audit_rows(page: Page) -> list[list[str]]:
    page.find("#audit")
    return [
        [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")]
        for row in page.browser.find_elements(By.CSS_SELECTOR, "tr.audit-row")
    ]


def test_the_audit_page_shows_who_replayed_what_and_filters(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("audited")
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,)))

    page.open("/login")
    page.find("#user").send_keys("alice")
    page.find("#password").send_keys(PASSWORD)
    page.click("#sign-in")
    wait_until(lambda: "/login" not in page.browser.current_url, "signed in", timeout=10)
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    page.click("#replay-one")
    page.click("#confirm")
    assert "replayed 1 of 1" in page.text("#outcome")

    page.link("Audit")
    Select(page.find("#audit-who")).select_by_value("alice")
    page.find("#audit-q").send_keys(queue)
    page.click("#audit-filter")
    wait_until(lambda: "q=" in page.browser.current_url, "filtered", timeout=10)
    (replayed,) = audit_rows(page)
    assert replayed[1:4] == ["alice", "dlq.replay", "1"]
    assert f"queue={queue}" in replayed[4]
    assert f"ids={message_id}" in replayed[4]
    page.shot("audit")

    page.open("/audit?who=alice&action=login&since=1h")
    signed_in = audit_rows(page)
    assert signed_in
    assert all(row[1:3] == ["alice", "login"] for row in signed_in)
    assert "outcome=signed in" in signed_in[0][4]

    page.open("/audit?since=soon")
    assert "expected a duration" in page.text("#problem")
