"""One message's story in a real headless Chromium (issue 34 item 6), on PostgreSQL and
RabbitMQ with real workers and a real relay: an order's handler commits, makes an effect and
sends an invoice message through the outbox; the order's story shows its claim, its effect
(linked to the effect's page), and the invoice waiting in the outbox, linked to the
invoice's own story, which names the order as its cause; once the relay sent the invoice
and its handler failed, the order's story shows the invoice's dead letter.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence F811)."""

# ruff: noqa: F811

from __future__ import annotations

import uuid
from typing import Any

from console_support import settings
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401

from inbox import Inbox, Message, Outbox
from inbox.broker import Publisher, Relay, RetryPolicy, Worker
from inbox.delivery.headers import CAUSATION_ID, CONVERSATION_ID
from inbox.operations._dead_letters import dead_letter_queue
from inbox.schema import outbox_message


def text_now(page: Page, css: str = "main") -> str:
    """The text of ``css`` on the page shown now ("" when it has none, or it is going)."""
    try:
        found = page.browser.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else ""
    except StaleElementReferenceException:  # the next page is replacing this one
        return ""


def shows(page: Page, css: str, wanted: str, *, exactly: bool = True) -> None:
    """Wait until ``css`` shows ``wanted`` (or holds it): after a click, the page read is
    the next one, not the one clicked on (which may have the same element)."""

    def there() -> bool:
        text = text_now(page, css)
        return text == wanted if exactly else wanted in text

    wait_until(there, f"{css} to show {wanted!r} on {page.browser.current_url}", timeout=15)


def titled(page: Page, title: str) -> None:
    """Wait until the page shown has ``title``."""
    wait_until(lambda: page.browser.title == title, f"the title {title!r}", timeout=15)


def order_app(db: Database, billing: str) -> Inbox:
    """Orders: commit the order, send the provider a receipt (an effect), and ask billing
    for an invoice (an outbox message to the billing queue)."""
    inbox = Inbox(sessionmaker(db.engine))
    outbox = Outbox()

    @inbox.handler("order.placed", name="orders.place")
    def place(message: Message, session: Session) -> None:
        record_effect(message, session, "orders.place")
        inbox.effect("receipt.send", lambda key: {"receipt": str(key)})
        outbox.publish(session, "invoice.requested", {"ref": "inv-1"}, routing_key=billing)

    return inbox


def billing_app(db: Database) -> Inbox:
    """Billing, broken: every invoice fails and is dead-lettered."""
    inbox = Inbox(sessionmaker(db.engine))

    @inbox.handler("invoice.requested", name="billing.invoice")
    def invoice(message: Message, session: Session) -> None:
        raise ValueError("no tax rate for country XX")

    return inbox


def invoice_row(db: Database) -> tuple[str, dict[str, Any]]:
    """The invoice's outbox row: its id and headers (waiting for the relay)."""
    from inbox.outbox import headers_from_json

    with db.engine.connect() as connection:
        row_id, headers = connection.execute(
            select(outbox_message.c.id, outbox_message.c.headers)
        ).one()
    return str(row_id), headers_from_json(headers)


def test_a_story_shows_claims_effects_the_message_it_sent_and_links_both_ways(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    orders, billing = rabbit.queue("orders"), rabbit.queue("billing")
    workers = [
        Worker(order_app(pg_db, billing), rabbit.url, [orders]),
        Worker(billing_app(pg_db), rabbit.url, [billing], retry=RetryPolicy((0.1,), max_tries=1)),
    ]
    for worker in workers:
        worker.prepare()
    threads = [run_in_thread(worker) for worker in workers]
    try:
        with Publisher(rabbit.url, routing_key=orders) as publisher:
            order_id = str(publisher.publish("order.placed", {"ref": "order-1"}))
        wait_until(lambda: pg_db.effect_counts().get(("order-1", "orders.place")) == 1, "order")
        invoice_id, headers = invoice_row(pg_db)
        assert headers[CAUSATION_ID] == order_id
        assert headers[CONVERSATION_ID] == order_id
        console.serve(settings(pg_db, rabbit, (orders, billing)))

        page.sign_in()
        page.link("Story")
        page.find("#q").send_keys(order_id)
        page.click("#tell")
        titled(page, f"Story of {order_id} · inbox console")
        assert "orders.place" in page.text("#story-claims")
        assert "receipt.send" in page.text("#story-effects")
        assert "done" in page.text("#story-effects")
        assert page.text("#sent").count(invoice_id) == 1
        assert "invoice.requested" in page.text("#sent")
        page.shot("story")

        page.click(f"a.downstream[href*='{invoice_id}']")  # to the invoice's story
        shows(page, "#story-of", invoice_id)
        assert page.text("#cause") == order_id
        assert page.text("#conversation") == order_id
        assert "waits for the relay" in page.text("#own-row")
        page.click("#cause")  # and back to the order's
        shows(page, "#story-of", order_id)

        page.open(f"/story?q={order_id}")
        page.click("a.effect")  # an effect row links to the effect's page
        wait_until(lambda: "/effects/" in page.browser.current_url, "the effect's page")
        shows(page, "main", "receipt.send", exactly=False)
        effect_url = page.browser.current_url

        page.open(f"/claims?q={order_id}")  # the claims page's effect rows link there too
        page.click("tr.effect-row a.effect")
        wait_until(lambda: page.browser.current_url == effect_url, "the same effect's page")
        page.open(f"/claims?q={order_id}")
        page.click("#story-link")
        shows(page, "#story-of", order_id)

        relay = Relay(pg_db.engine, rabbit.url, poll_interval=0.1, listen=False)
        try:
            relay.drain()
        finally:
            relay.close()
        wait_until(lambda: rabbit.depth(dead_letter_queue(billing)) == 1, "the invoice dead")

        page.open(f"/story?q={order_id}")
        assert "none waiting in the outbox" in page.text("#sent")
        sent_letters = page.browser.find_elements(By.CSS_SELECTOR, "tr.sent-letter")
        assert len(sent_letters) == 1
        assert invoice_id in sent_letters[0].text
        assert "handler-failed" in sent_letters[0].text
        page.shot("story-dead-letter")
        page.click(f"tr.sent-letter a.letter[href*='{invoice_id}']")
        assert page.text("#message-id") == invoice_id
        assert "no tax rate" in page.text("#error")

        page.open(f"/story?q={invoice_id}")  # the invoice's own story: its dead letter
        assert page.text("#cause") == order_id
        assert len(page.browser.find_elements(By.CSS_SELECTOR, "tr.own-letter")) == 1
        assert rabbit.depth(dead_letter_queue(billing)) == 1  # read, left in place
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(timeout=30)


def test_a_story_by_an_unknown_id_and_a_bad_text(page: Page, console: Console, pg_db: Any) -> None:
    console.serve(settings(pg_db, None))
    page.sign_in()
    unknown = str(uuid.uuid4())
    page.open(f"/story?q={unknown}")
    assert "no handler has committed it" in page.text("#story-claims")
    assert "none waiting in the outbox" in page.text("#sent")
    assert "No queues" in page.text()
    page.open("/story?q=%20")
    assert page.find("#q").get_attribute("value") == ""
