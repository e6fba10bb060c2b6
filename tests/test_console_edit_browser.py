"""Edit a dead letter, then replay the edited copy, in a real headless Chromium (issue 34
item 5), on PostgreSQL and RabbitMQ with a real worker: a payment's record handler commits,
its charge handler (a typed body) fails on a negative amount and the message is
dead-lettered; an edit the charge's body type refuses is shown and nothing moves; the fixed
amount is previewed (before and after), confirmed and replayed under the same message id:
the charge runs and commits, the record handler skips it, the copy carries the
``x-inbox-edited-*`` headers and the audit line has the before and the after.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence F811)."""

# ruff: noqa: F811

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
from console_support import settings
from selenium.webdriver.remote.webelement import WebElement
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401
from test_console_story_browser import shows, titled

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.console._audit import AUDIT_LOGGER
from inbox.delivery import headers as h
from inbox.operations._dead_letters import dead_letter_queue
from inbox.schema import inbox_dead_letter_archive


@dataclasses.dataclass(frozen=True)
class Charge:
    ref: str
    amount: int


def payments_app(db: Database, seen: list[Message]) -> Inbox:
    inbox = Inbox(sessionmaker(db.engine))

    @inbox.handler("payment.requested", name="payments.record")
    def record(message: Message, session: Session) -> None:
        record_effect(message, session, "payments.record")

    @inbox.handler("payment.requested", name="payments.charge", body=Charge)
    def charge(message: Message[Charge], session: Session) -> None:
        seen.append(message)
        if message.body.amount <= 0:
            raise ValueError(f"amount must be positive, got {message.body.amount}")
        record_effect(Message(message.id, message.type, {"ref": message.body.ref}), session, "c")

    return inbox


def replace_text(field: WebElement, text: str) -> None:
    field.clear()
    field.send_keys(text)


def test_an_edited_dead_letter_is_replayed_and_only_the_failed_handler_runs(
    page: Page,
    console: Console,
    pg_db: Database,
    rabbit: Rabbit,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = rabbit.queue("payments")
    seen: list[Message] = []
    app = payments_app(pg_db, seen)
    worker = Worker(app, rabbit.url, [queue], retry=RetryPolicy((0.1,), max_tries=1))
    worker.prepare()
    thread = run_in_thread(worker)
    try:
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            message_id = str(
                publisher.publish(
                    "payment.requested", {"ref": "p-1", "amount": -5}, headers={"tenant": "acme"}
                )
            )
        wait_until(lambda: rabbit.depth(dead_letter_queue(queue)) == 1, "the dead letter")
        assert pg_db.effect_counts() == {("p-1", "payments.record"): 1}
        console.serve(dataclasses.replace(settings(pg_db, rabbit, (queue,)), application=app))

        page.sign_in()
        page.open(f"/dead-letters?queue={queue}")
        page.click(f"a.letter[href*='{message_id}']")
        page.click("#edit-one")
        titled(page, f"Edit dead letter {message_id} · inbox console")
        assert json.loads(page.find("#edit-body").get_attribute("value") or "") == {
            "ref": "p-1",
            "amount": -5,
        }
        assert json.loads(page.find("#edit-headers").get_attribute("value") or "") == {
            "tenant": "acme"
        }

        replace_text(page.find("#edit-body"), '{"ref": "p-1", "amount": "five"}')
        page.click("#check-edit")  # the charge's body type refuses it: the form again
        shows(
            page,
            "#edit-problems",
            "payments.charge: the new body does not fit its body type",
            exactly=False,
        )
        replace_text(page.find("#edit-body"), '{"ref": "p-1", "amount": 5')
        page.click("#check-edit")
        shows(page, "#edit-problems", "the body is not JSON", exactly=False)
        replace_text(page.find("#edit-headers"), '{"traceparent": "00-0-0-00"}')
        replace_text(page.find("#edit-body"), '{"ref": "p-1", "amount": 5}')
        page.click("#check-edit")
        shows(page, "#edit-problems", "'traceparent' is not edited", exactly=False)
        replace_text(page.find("#edit-headers"), '{"x-inbox-tries": 0}')
        replace_text(page.find("#edit-body"), '{"ref": "p-1", "amount": 5}')
        page.click("#check-edit")
        shows(page, "#edit-problems", "'x-inbox-tries' is not edited", exactly=False)
        assert rabbit.depth(dead_letter_queue(queue)) == 1  # nothing moved

        replace_text(page.find("#edit-headers"), '{"tenant": "acme", "fixed": "by hand"}')
        replace_text(page.find("#edit-body"), '{"ref": "p-1", "amount": 5}')
        page.click("#check-edit")
        shows(page, "#preview", "Replays the edited copy", exactly=False)
        preview = page.text()
        assert 'body before: {"ref": "p-1", "amount": -5}' in preview
        assert 'body after: {"ref": "p-1", "amount": 5}' in preview
        assert "payments.charge: fits its body type, claims under the same key" in preview
        assert "payments.record: claims under the same key" in preview
        page.shot("edit-replay")
        with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
            page.click("#confirm")
            assert f"replayed the edited copy of {message_id}" in page.text("#outcome")

        wait_until(lambda: ("p-1", "c") in pg_db.effect_counts(), "the charge after the edit")
        assert pg_db.effect_counts() == {("p-1", "payments.record"): 1, ("p-1", "c"): 1}
        assert rabbit.depth(dead_letter_queue(queue)) == 0
        replayed = seen[-1]
        assert str(replayed.id) == message_id
        assert replayed.body == Charge("p-1", 5)
        assert replayed.headers["fixed"] == "by hand"
        assert replayed.headers[h.EDITED_BY] == "token"
        assert replayed.headers[h.EDITED_BEFORE].startswith("sha256:")
        assert h.EDITED_AT in replayed.headers
        [line] = [r for r in caplog.records if "dlq.edit-replay" in r.getMessage()]
        audited: dict[str, Any] = line.inbox_audit  # type: ignore[attr-defined]
        assert audited["id"] == message_id
        assert '"amount": -5' in audited["before"]
        assert '"amount": 5' in audited["after"]
        # The original, as it was before the edit, is kept in the archive.
        with pg_db.engine.connect() as connection:
            kept = connection.execute(
                select(inbox_dead_letter_archive).where(
                    inbox_dead_letter_archive.c.ref == message_id
                )
            ).one()
        assert json.loads(kept.body) == {"ref": "p-1", "amount": -5}
        assert kept.archived_by == "token"
        assert audited["original_archived_as"] == str(kept.id)
    finally:
        worker.stop()
        thread.join(timeout=30)


def test_a_read_only_console_offers_no_edit_and_refuses_one(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    from console_support import dead_letter, declare_queues

    queue = rabbit.queue("ro")
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,), allow_actions=False))
    page.sign_in()
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    page.find("#message-id")
    assert not page.browser.find_elements("css selector", "#edit-one")
    page.open(f"/dead-letters/edit?queue={queue}&id={message_id}")
    assert "read-only console" in page.text("#problem")
    assert rabbit.depth(dead_letter_queue(queue)) == 1


def test_a_console_without_app_offers_no_edit_and_refuses_one(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    # Without the handlers no claim key can be checked: an edit of a field a key is
    # computed from would make handlers that committed the message run it again.
    from console_support import dead_letter, declare_queues

    queue = rabbit.queue("noapp")
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,)))
    page.sign_in()
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    page.find("#archive-one")  # an action console
    assert not page.browser.find_elements("css selector", "#edit-one")
    page.open(f"/dead-letters/edit?queue={queue}&id={message_id}")
    assert "start the console with --app" in page.text("#problem")
    assert rabbit.depth(dead_letter_queue(queue)) == 1


def test_inbox_console_app_names_the_application_inbox(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--app`` loads the application's Inbox as inbox-worker does; a wrong one is one line
    and exit 2, before anything is served."""
    import io

    from console_support import TOKEN

    from inbox.admin import admin_main

    monkeypatch.setenv("INBOX_CONSOLE_TOKEN", TOKEN)
    err = io.StringIO()
    code = admin_main(
        ["console", "--database-url", pg_db.url, "--app", "no_such_module_here:inbox"],
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 2
    assert "cannot import 'no_such_module_here'" in err.getvalue()
    code = admin_main(
        ["console", "--database-url", pg_db.url, "--app", "test_console_edit_browser:Charge"],
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 2
    assert "Charge() raised TypeError" in err.getvalue()


def test_a_hostile_body_is_text_in_the_edit_form(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    from console_support import dead_letter, declare_queues

    queue = rabbit.queue("hostile")
    declare_queues(rabbit, queue)
    hostile = "</textarea><script>document.title='owned'</script><b id=owned>x</b>"
    message_id = dead_letter(rabbit, queue, json.dumps({"note": hostile}).encode())
    app = payments_app(pg_db, [])
    console.serve(dataclasses.replace(settings(pg_db, rabbit, (queue,)), application=app))
    page.sign_in()
    page.open(f"/dead-letters/edit?queue={queue}&id={message_id}")
    assert json.loads(page.find("#edit-body").get_attribute("value") or "") == {"note": hostile}
    titled(page, f"Edit dead letter {message_id} · inbox console")
    assert not page.browser.find_elements("css selector", "#owned")
