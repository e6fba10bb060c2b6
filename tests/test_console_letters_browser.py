"""The console's dead-letters table and its replay preview in a real headless Chromium
(issue 32 items 8, 9 and 10), on RabbitMQ: rows in the order they were dead-lettered,
sortable by any column, each error on one line (the whole text on the letter's page), rows
ticked for replay or purge, dead letters without a message id shown and moved one by one,
and a preview that lists what it will replay, "at most N" counting matching letters.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (pytest finds fixtures by it; hence the
file's F811: each test's argument is the fixture imported)."""

# ruff: noqa: F811

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from console_support import dead_letter, declare_queues, settings
from selenium.webdriver.common.by import By
from support.rabbit import Rabbit
from support.worker import wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401

from inbox.delivery import headers as h
from inbox.operations import _claims
from inbox.operations._dead_letters import dead_letter_queue, open_channel, publish_confirmed

NOW = dt.datetime.now(dt.UTC)


def no_id_letter(rabbit: Rabbit, queue: str, at: dt.datetime) -> None:
    """A dead letter of a producer that sets no message id."""
    properties: dict[str, Any] = {
        "type": "op",
        "delivery_mode": 2,
        "application_headers": {
            h.REASON: "unhandled-type",
            h.TRIES: 1,
            h.ERROR: "no handler for op",
            h.DEAD_LETTERED_AT: at.isoformat(),
        },
    }
    with open_channel(rabbit.url) as channel:
        publish_confirmed(channel, b'{"no": "id"}', properties, dead_letter_queue(queue))


def sign_in(page: Page) -> None:
    """Sign in, and wait for the overview (the next page opened is not raced by the
    sign-in's redirect)."""
    page.sign_in()
    wait_until(lambda: "/login" not in page.browser.current_url, "signed in", timeout=10)
    page.find("#dlq-depth-1")


def rows(page: Page) -> list[list[str]]:
    """The table's rows as their cells' texts (the selection box's cell is empty)."""
    page.find("#letters")
    return [
        [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")][1:]
        for row in page.browser.find_elements(By.CSS_SELECTOR, "tr.letter-row")
    ]


def test_the_table_is_ordered_sortable_and_rows_are_selected_for_replay_and_purge(
    page: Page, console: Console, pg_db: Any, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("payments")
    declare_queues(rabbit, queue)
    newest = dead_letter(
        rabbit,
        queue,
        ref="c",
        error="ValueError: card declined\nTraceback line two\nline three",
        dead_lettered_at=NOW,
    )
    middle = dead_letter(rabbit, queue, ref="b", dead_lettered_at=NOW - dt.timedelta(hours=1))
    oldest = dead_letter(
        rabbit,
        queue,
        ref="a",
        reason="handler-failed",
        dead_lettered_at=NOW - dt.timedelta(hours=3),
    )
    no_id_letter(rabbit, queue, NOW - dt.timedelta(hours=2))
    console.serve(settings(pg_db, rabbit, (queue,)))

    sign_in(page)
    page.open(f"/dead-letters?queue={queue}")
    shown = rows(page)
    # Dead-lettered time, oldest first (the queue holds them newest first).
    assert shown[0][0] == oldest
    assert shown[1][0].startswith("no id sha256:")
    assert [r[0] for r in shown][2:] == [middle, newest]
    assert shown[3][7] == "ValueError: card declined …"  # one line; the rest on its page

    assert (
        page.text("#order")
        == "Sorted by dead-lettered, oldest first: click a heading to sort by it."
    )
    page.click("#sort-at")  # the same column again: newest first
    assert rows(page)[0][0] == newest
    assert page.text("#order").startswith("Sorted by dead-lettered, newest first")
    page.click("#sort-reason")
    assert page.text("#order").startswith("Sorted by reason, ascending")
    assert [r[2] for r in rows(page)] == [
        "handler-failed",
        "handler-failed",
        "handler-failed",
        "unhandled-type",
    ]

    page.open(f"/dead-letters?queue={queue}")
    page.click(f"a.letter[href*='{newest}']")
    assert "Traceback line two\nline three" in page.text("#error")

    page.open(f"/dead-letters?queue={queue}")
    page.click("#replay-selected")  # nothing ticked: nothing is taken
    assert "no dead letter selected" in page.text("#problem")
    assert rabbit.depth(dead_letter_queue(queue)) == 4

    page.open(f"/dead-letters?queue={queue}")
    page.click(f"input.pick[value='{middle}']")
    page.click("input.pick[value^='sha256:']")
    page.click("#replay-selected")
    assert "would replay 2 of 4" in page.text("#preview")
    listed = page.text("#taken")
    assert middle in listed
    assert "unhandled-type" in listed
    page.click("#confirm")
    assert "replayed 2 of 4" in page.text("#outcome")
    taken = rabbit.take_all(queue)
    assert sorted(m.properties.get("message_id") or "none" for m in taken) == sorted(
        [middle, "none"]
    )

    page.open(f"/dead-letters?queue={queue}")
    page.click(f"input.pick[value='{oldest}']")
    page.click("#purge-selected")
    assert "would purge 1 of 2" in page.text("#preview")
    page.click("#confirm")
    assert "purged 1 of 2" in page.text("#outcome")
    wait_until(lambda: rabbit.depth(dead_letter_queue(queue)) == 1, "one dead letter left")
    assert [m.properties["message_id"] for m in rabbit.take_all(dead_letter_queue(queue))] == [
        newest
    ]


def test_a_dead_letter_without_a_message_id_is_shown_and_purged_alone(
    page: Page, console: Console, pg_db: Any, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("sms")
    declare_queues(rabbit, queue)
    no_id_letter(rabbit, queue, NOW - dt.timedelta(minutes=5))
    kept = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,)))

    sign_in(page)
    page.open(f"/dead-letters?queue={queue}")
    page.click("a.letter[href*='sha256']")
    assert page.text("#message-id").startswith("sha256:")
    assert '{"no": "id"}' in page.text("#body")
    page.click("#purge-one")
    assert "would purge 1 of 2" in page.text("#preview")
    page.click("#confirm")
    assert "purged 1 of 2" in page.text("#outcome")
    assert [m.properties["message_id"] for m in rabbit.take_all(dead_letter_queue(queue))] == [kept]


def test_the_replay_preview_lists_what_it_will_replay_and_at_most_counts_matches(
    page: Page, console: Console, pg_db: Any, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("orders")
    declare_queues(rabbit, queue)
    wanted = []
    for i in range(8):
        if i % 3 == 2:
            wanted.append(dead_letter(rabbit, queue, ref=f"w{i}", error=f"KeyError: {i}"))
        else:
            dead_letter(rabbit, queue, ref=f"o{i}", reason="unhandled-type")
    console.serve(settings(pg_db, rabbit, (queue,)))

    sign_in(page)
    page.open(f"/dead-letters?queue={queue}")
    page.click("input[name='reason'][value='handler-failed']")
    page.find("input[name='limit']").send_keys("2")
    page.click("#replay-filtered")
    assert page.text("#preview").startswith(
        f"would replay 2 of 8 dead letters from {dead_letter_queue(queue)} to {queue} "
        "(read 6, matched 2)"
    )
    preview = [
        [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")]
        for row in page.browser.find_elements(By.CSS_SELECTOR, "tr.taken-row")
    ]
    assert preview == [
        [wanted[0], "op", "handler-failed", "KeyError: 2", "3", "0"],
        [wanted[1], "op", "handler-failed", "KeyError: 5", "3", "0"],
    ]
    page.click("#confirm")
    assert "replayed 2 of 8" in page.text("#outcome")
    assert [m.properties["message_id"] for m in rabbit.take_all(queue)] == wanted


def test_a_confirmed_purge_leaves_a_dead_letter_that_came_after_its_preview(
    page: Page, console: Console, pg_db: Any, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("mail")
    declare_queues(rabbit, queue)
    dead_letter(rabbit, queue, ref="a")
    console.serve(settings(pg_db, rabbit, (queue,)))

    sign_in(page)
    page.open(f"/dead-letters?queue={queue}")
    page.click("input[name='reason'][value='handler-failed']")
    page.click("#purge-filtered")
    assert page.text("#preview").startswith("would purge 1 of 1 dead letters")
    late = dead_letter(rabbit, queue, ref="late")  # matches, but was never shown
    page.click("#confirm")
    outcome = page.text("#outcome")
    assert "purged 1 of 2" in outcome
    assert "bounded to the preview: the first 1 dead letters, at most 1 taken" in outcome
    assert [m.properties["message_id"] for m in rabbit.take_all(dead_letter_queue(queue))] == [late]


def test_the_claims_search_reads_a_bounded_part_of_a_long_dead_letter_queue(
    page: Page, console: Console, pg_db: Any, rabbit: Rabbit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id no claim has is looked for in the first ``DEAD_LETTERS_READ`` dead letters (2
    here) of each queue, and the page says when there were more."""
    monkeypatch.setattr(_claims, "DEAD_LETTERS_READ", 2, raising=False)
    queue = rabbit.queue("long")
    declare_queues(rabbit, queue)
    for ref in ("a", "b"):
        dead_letter(rabbit, queue, ref=ref)
    third = dead_letter(rabbit, queue, ref="c")
    console.serve(settings(pg_db, rabbit, (queue,)))

    sign_in(page)
    page.open(f"/claims?q={third}")
    assert page.text(".read-in-part") == (
        f"read only the first 2 of the 3 dead letters in {dead_letter_queue(queue)}: its dead "
        "letter may be further back (inbox dlq show ID reads them all)"
    )
    assert page.text("#not-found") == "No claim or effect record."
    assert rabbit.depth(dead_letter_queue(queue)) == 3
