"""The console in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium; no browser is downloaded): a person's jobs end to end, on PostgreSQL
and RabbitMQ, against the console served by uvicorn as ``inbox console`` serves it.

A missing browser or driver skips these tests locally and FAILS them under CI=true.
``INBOX_CONSOLE_SCREENSHOTS=1`` saves a screenshot of each page into docs/console/ (the
pictures of docs/console.md); without it nothing is written.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from console_support import (
    TOKEN,
    Sms,
    dead_letter,
    declare_queues,
    refused_outbox_row,
    settings,
)
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from support.databases import Database, cannot_run
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until

from inbox import Inbox, Message
from inbox.broker import Publisher, Relay, RetryPolicy, Worker
from inbox.console import ConsoleSettings, create_app
from inbox.operations._dead_letters import dead_letter_queue, open_channel

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "console"
HOSTILE = "<script>document.title='owned'</script><img src=x onerror=\"document.title='owned'\">"


class Console:
    """The console app served on a free local port; each test gives it its settings."""

    def __init__(self) -> None:
        self.app: Starlette | None = None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self, console: ConsoleSettings) -> None:
        assert self.app is not None
        self.app.state.settings = console


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    served = Console()
    placeholder = None

    def app_factory() -> Starlette:
        return create_app(placeholder)  # type: ignore[arg-type]  # replaced per test

    served.app = app_factory()
    server = uvicorn.Server(
        uvicorn.Config(served.app, host="127.0.0.1", port=served.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.05)
    yield served
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        cannot_run(
            "chromium or chromedriver not installed (apt-get install chromium chromium-driver)"
        )
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium fetch a browser
    options = Options()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    try:
        chrome = webdriver.Chrome(service=Service(driver), options=options)
    except WebDriverException as exc:
        cannot_run(f"chromium would not start: {exc.msg}")
    chrome.implicitly_wait(0)
    yield chrome
    chrome.quit()


@pytest.fixture
def page(browser: webdriver.Chrome, console: Console) -> Page:
    browser.get(console.url + "/static/console.css")  # the console's origin, no page yet
    browser.delete_all_cookies()
    return Page(browser, console.url)


class Page:
    """A person at the browser."""

    def __init__(self, browser: webdriver.Chrome, url: str) -> None:
        self.browser = browser
        self.url = url

    def open(self, path: str) -> None:
        self.browser.get(self.url + path)

    def sign_in(self, token: str = TOKEN) -> None:
        self.open("/login")
        self.find("#token").send_keys(token)
        self.click("#sign-in")
        if token == TOKEN:  # the next page opened must not race the sign-in's redirect
            wait_until(lambda: "/login" not in self.browser.current_url, "signed in", timeout=10)

    def find(self, css: str) -> WebElement:
        found: list[WebElement] = []

        def present() -> bool:
            found[:] = self.browser.find_elements(By.CSS_SELECTOR, css)
            return bool(found)

        wait_until(present, f"{css} on {self.browser.current_url}", timeout=10)
        return found[0]

    def click(self, css: str) -> None:
        self.find(css).click()

    def text(self, css: str = "main") -> str:
        return self.find(css).text

    def link(self, text: str) -> None:
        found: list[WebElement] = []

        def present() -> bool:  # the page may still be loading after the last click
            found[:] = self.browser.find_elements(By.PARTIAL_LINK_TEXT, text)
            return bool(found)

        wait_until(present, f"a link {text!r} on {self.browser.current_url}", timeout=10)
        found[0].click()

    def shot(self, name: str) -> None:
        """Save a screenshot for the docs, when INBOX_CONSOLE_SCREENSHOTS asks for them."""
        if os.environ.get("INBOX_CONSOLE_SCREENSHOTS"):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            self.browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def worker_app(db: Database, broken: Callable[[], bool]) -> Inbox:
    inbox = Inbox(sessionmaker(db.engine))

    def apply(message: Message, session: Session) -> None:
        if broken():
            raise ValueError(f"poison {message.body}")
        record_effect(message, session, "ops.apply")

    inbox.handler("op", name="ops.apply")(apply)
    return inbox


def test_find_a_dead_letter_replay_it_and_see_it_processed(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue("orders")
    broken = [True]
    worker = Worker(
        worker_app(pg_db, lambda: broken[0]),
        rabbit.url,
        [queue],
        retry=RetryPolicy((0.1,), max_tries=1),
    )
    worker.prepare()
    thread = run_in_thread(worker)
    try:
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            message_id = str(publisher.publish("op", {"ref": "order-1"}))
        wait_until(lambda: rabbit.depth(dead_letter_queue(queue)) == 1, "the dead letter")
        broken[0] = False  # the cause is fixed; the dead letter waits for a person
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            for ref in ("order-2", "order-3"):
                publisher.publish("op", {"ref": ref})
        wait_until(lambda: len(pg_db.effect_counts()) == 2, "the other orders")
        console.serve(settings(pg_db, rabbit, (queue,)))

        page.sign_in()
        assert page.text("#dlq-depth-1") == "1"
        assert "ops.apply" in page.text("#claims-chart")
        assert "handler-failed" in page.text("#reasons-chart-1")
        page.shot("overview")
        page.link("Dead letters")
        page.find(f"a.letter[href*='{message_id}']")
        assert "handler-failed: 1" in page.text()
        page.shot("dead-letters")
        page.click(f"a.letter[href*='{message_id}']")
        assert page.text("#message-id") == message_id
        assert "poison" in page.text()
        page.shot("dead-letter")
        page.click("#replay-one")
        assert "would replay 1 of 1" in page.text("#preview")
        page.shot("confirm-replay")
        page.click("#confirm")
        assert "replayed 1 of 1" in page.text("#outcome")

        wait_until(lambda: ("order-1", "ops.apply") in pg_db.effect_counts(), "the replay")
        assert pg_db.effect_counts()[("order-1", "ops.apply")] == 1
        page.link("Claims")
        page.find("#q").send_keys(message_id)
        page.click("#look-up")
        claims = page.text("#claims")
        assert "ops.apply" in claims
        page.shot("claims")
    finally:
        worker.stop()
        thread.join(timeout=30)


def test_resolve_an_uncertain_effect(page: Page, console: Console, pg_db: Database) -> None:
    sms = Sms(pg_db)
    key = sms.fail_once()
    console.serve(settings(pg_db, None))

    page.sign_in()
    page.link("Effects")
    page.click(f"a.effect[href='/effects/{key}']")
    assert page.text("#status") == "failed"
    page.shot("effect")
    page.find("#result-input").send_keys('{"id": "sms-77"}')
    page.click("#mark-done")
    assert "next attempt returns it" in page.text("#preview")
    page.click("#confirm")
    assert "done with the given result" in page.text("#outcome")
    page.open(f"/effects/{key}")
    assert page.text("#status") == "done"

    sms.process()  # the replayed delivery
    assert sms.seen == [{"id": "sms-77"}]
    assert len(sms.calls) == 1


def test_retry_a_refused_outbox_row_after_declaring_the_missing_queue(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    target = rabbit.queue("shipped")
    row = refused_outbox_row(pg_db, rabbit, target)
    console.serve(settings(pg_db, rabbit))

    page.sign_in()
    page.link("Outbox")
    assert "NO_ROUTE" in page.text("#refused")
    page.shot("outbox")
    with open_channel(rabbit.url) as channel:
        channel.queue_declare(queue=target, durable=True, auto_delete=False)
    page.click(f"input.row[value='{row}']")
    page.click("#retry")
    assert "1 of 1 chosen row(s) due now" in page.text("#outcome")
    relay = Relay(pg_db.engine, rabbit.url, listen=False)
    try:
        assert relay.drain() == 1
    finally:
        relay.close()
    assert rabbit.depth(target) == 1
    page.click("#back")
    assert page.text("#pending") == "0"


def test_a_read_only_console_does_not_act_even_on_a_forged_form(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,), allow_actions=False))

    page.sign_in()
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    assert "Read-only" in page.text("#read-only")
    assert not page.browser.find_elements(By.CSS_SELECTOR, "#replay-one")
    page.shot("read-only")
    forge: Any = page.browser.execute_script
    forge(
        """
        const form = document.createElement('form');
        form.method = 'post'; form.action = '/dead-letters/replay';
        for (const [k, v] of Object.entries(arguments[0])) {
          const input = document.createElement('input');
          input.type = 'hidden'; input.name = k; input.value = v; form.appendChild(input);
        }
        document.body.appendChild(form); form.submit();
        """,
        {"queue": queue, "id": message_id, "confirmed": "yes", "csrf": "forged"},
    )
    assert "read-only console" in page.text("#problem")
    assert rabbit.depth(dead_letter_queue(queue)) == 1
    assert rabbit.depth(queue) == 0


def test_without_the_token_nothing_is_shown(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    console.serve(settings(pg_db, rabbit, (queue,)))

    page.open(f"/dead-letters?queue={queue}")
    assert "/login" in page.browser.current_url
    page.shot("login")
    page.sign_in("not-the-token-at-all")
    assert page.text("#login-error") == "wrong token or password"
    assert message_id not in page.browser.page_source
    page.open(f"/dead-letters?queue={queue}")
    assert "/login" in page.browser.current_url


def test_a_hostile_body_renders_as_text(
    page: Page, console: Console, pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue, HOSTILE.encode() + b"\n" + b"A" * 50_000, error=HOSTILE)
    console.serve(settings(pg_db, rabbit, (queue,), max_body=2000))

    page.sign_in()
    page.open(f"/dead-letters/message?queue={queue}&id={message_id}")
    body = page.text("#body")
    assert body.startswith(HOSTILE)  # shown as the characters it is
    assert len(body) <= 2000
    assert page.browser.title != "owned"
    assert not page.browser.find_elements(By.CSS_SELECTOR, "main script, main img")
    page.shot("hostile-body")
    assert page.browser.title != "owned"
