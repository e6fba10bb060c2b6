"""The live queues in a real headless Chromium (issue 34 item 2), on PostgreSQL and RabbitMQ
with a real ``inbox-worker --metrics-port`` process: each queue's depth, unacked messages,
consumers and rates (from RabbitMQ's management API, and without it from a passive declare
and the worker's counters), each worker's processed and duplicate counts and when it last
answered; and the overview's uncertain-effects count shown as an alert.

The browser, the served console and the page helpers are those of
tests/test_console_browser.py, imported by name (hence F811)."""

# ruff: noqa: F811

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from console_support import Sms, declare_queues, settings
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import WorkerProcess, wait_until
from test_console_browser import Console, Page, browser, console, page  # noqa: F401
from test_console_story_browser import titled
from test_health import free_port, start_worker, started, wait_for_status  # noqa: F401

from inbox.broker import Publisher

MANAGEMENT = "http://guest:guest@127.0.0.1:15672"


@pytest.fixture
def live_worker(
    pg_db: Database, rabbit: Rabbit, started: list[WorkerProcess], tmp_path: Path
) -> Callable[[str], tuple[WorkerProcess, int]]:
    """Start ``inbox-worker broker_app:inbox --metrics-port`` on a queue; it and its port,
    once its /readyz says 200."""

    def start(queue: str) -> tuple[WorkerProcess, int]:
        port = free_port()
        worker = start_worker(
            started, tmp_path, rabbit, database_url=pg_db.url, queue=queue, port=port
        )
        wait_for_status(port, "/readyz", 200, worker)
        return worker, port

    return start


def cell(page: Page, row: str, column: str) -> str:
    return page.text(f"{row} td.{column}")


def eventually(page: Page, row: str, column: str, expected: str) -> None:
    """Reload the queues page until the cell shows ``expected``: the management API's
    numbers are its last sample, up to its collection interval (5 s) old."""

    def shown() -> bool:
        page.open("/queues")
        return cell(page, row, column) == expected

    wait_until(shown, f"{row} {column} to show {expected}", timeout=30)


def test_queue_numbers_and_worker_counters_from_the_management_api_and_the_worker(
    page: Page,
    console: Console,
    pg_db: Database,
    rabbit: Rabbit,
    live_worker: Callable[[str], tuple[WorkerProcess, int]],
) -> None:
    live, idle = rabbit.queue("live"), rabbit.queue("idle")
    worker, port = live_worker(live)
    declare_queues(rabbit, idle)  # a queue no worker consumes: its messages wait
    repeated = uuid.uuid4()
    with Publisher(rabbit.url, routing_key=live) as publisher:
        for ref in ("a", "b", "c"):
            publisher.publish("op", {"ref": ref})
        publisher.publish("op", {"ref": "d"}, message_id=repeated)
        publisher.publish("op", {"ref": "d"}, message_id=repeated)  # a duplicate
    with Publisher(rabbit.url, routing_key=idle) as publisher:
        for ref in ("x", "y"):
            publisher.publish("op", {"ref": ref})
    wait_until(lambda: len(pg_db.effect_counts()) == 4, "the worker's four messages")
    worker_url = f"http://127.0.0.1:{port}/readyz"
    console.serve(
        dataclasses.replace(
            settings(pg_db, rabbit, (live, idle)), workers=(worker_url,), management=MANAGEMENT
        )
    )

    page.sign_in()
    page.link("Queues")
    titled(page, "Queues · inbox console")
    assert live in page.text("#queue-1")
    eventually(page, "#queue-1", "consumers", "1")
    eventually(page, "#queue-2", "depth", "2")
    assert cell(page, "#queue-1", "depth") == "0"
    assert cell(page, "#queue-1", "unacked") == "0"
    assert cell(page, "#queue-1", "in").endswith("/s")  # the broker's publish rate
    assert cell(page, "#queue-2", "consumers") == "0"
    assert "problem" in (page.find("#queue-2 td.consumers").get_attribute("class") or "")
    assert cell(page, "#worker-1", "processed") == "4"
    assert cell(page, "#worker-1", "duplicates") == "1"
    assert cell(page, "#worker-1", "failed") == "0"
    assert f"{live}: 5" in cell(page, "#worker-1", "consumed")
    assert cell(page, "#worker-1", "seen").startswith("20")  # a UTC time, on one line
    page.shot("queues")

    worker.terminate()  # a worker gone: unreachable, last seen kept
    page.open("/queues")
    assert "unreachable" in page.text("#worker-1")
    assert cell(page, "#worker-1", "seen").startswith("20")


def test_without_the_management_api_the_out_rate_comes_from_two_looks(
    page: Page,
    console: Console,
    pg_db: Database,
    rabbit: Rabbit,
    live_worker: Callable[[str], tuple[WorkerProcess, int]],
) -> None:
    live = rabbit.queue("plain")
    _, port = live_worker(live)
    console.serve(
        dataclasses.replace(settings(pg_db, rabbit, (live,)), workers=(f"http://127.0.0.1:{port}",))
    )
    page.sign_in()
    page.open("/queues")
    assert cell(page, "#queue-1", "consumers") == "1"
    assert cell(page, "#queue-1", "unacked") == "-"  # only the management API says
    with Publisher(rabbit.url, routing_key=live) as publisher:
        for ref in ("a", "b", "c"):
            publisher.publish("op", {"ref": ref})
    wait_until(lambda: len(pg_db.effect_counts()) == 3, "three messages")
    page.open("/queues")  # the second look: the counters moved since the first
    assert cell(page, "#queue-1", "out").endswith("/s")
    assert cell(page, "#queue-1", "out") != "0.0/s"


def test_the_overview_shows_uncertain_effects_as_an_alert(
    page: Page, console: Console, pg_db: Database
) -> None:
    console.serve(settings(pg_db, None))
    page.sign_in()
    assert page.text("#uncertain-count") == "0"
    assert not page.browser.find_elements("css selector", "#uncertain-alert")
    Sms(pg_db).fail_once()
    page.open("/")
    alert = page.find("#uncertain-alert")
    assert alert.get_attribute("role") == "alert"
    assert "a person must decide each one" in alert.text
    assert page.text("#uncertain-count") == "1"


def test_the_metrics_text_is_read_as_prometheus_writes_it() -> None:
    from inbox.operations._queues import parse_metrics

    text = (
        "# HELP inbox_processed_total handler runs that committed\n"
        "# TYPE inbox_processed_total counter\n"
        'inbox_processed_total{inbox_handler="a,b",inbox_message_type="x=\\"y\\""} 3.0\n'
        "inbox_processed_total 2\n"
        "broken_line\n"
        'messaging_client_consumed_messages_total{messaging_destination_name="q"} 5.0 1700\n'
    )
    samples = parse_metrics(text)
    assert [value for _, value in samples["inbox_processed_total"]] == [3.0, 2.0]
    assert samples["inbox_processed_total"][0][0]["inbox_handler"] == "a,b"
    assert samples["messaging_client_consumed_messages_total"] == [
        ({"messaging_destination_name": "q"}, 5.0)
    ]
    assert "broken_line" not in samples
