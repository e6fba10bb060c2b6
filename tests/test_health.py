"""``inbox-worker --metrics-port``: real HTTP requests against a running ``inbox-worker``
subprocess on the real RabbitMQ and PostgreSQL. ``/metrics`` counts what a foreign producer's
deliveries did (duplicates included), ``/healthz`` follows the consume loop, ``/readyz`` the
broker and the database (503 while the database is gone, 200 once it is back)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from support.databases import POSTGRES_URL, effects_metadata, unreachable
from support.rabbit import Rabbit
from support.worker import TESTS_DIR, WorkerProcess, declare, wait_until, worker_command

from inbox.broker._health import HealthServer
from inbox.schema import metadata as inbox_metadata

HANDLER = "ops.apply"  # broker_app's handler


@dataclass
class OwnDatabase:
    """A PostgreSQL database of this test alone, which the test may drop and create again."""

    name: str
    url: str
    admin: Engine

    def create(self) -> None:
        with self.admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE {self.name}"))
        engine = create_engine(self.url)
        try:
            inbox_metadata.create_all(engine)
            effects_metadata.create_all(engine)
        finally:
            engine.dispose()

    def drop(self) -> None:
        with self.admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)"))


@pytest.fixture
def own_db(admin_engines: dict[str, Engine]) -> Iterator[OwnDatabase]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    database = OwnDatabase(name, url, admin_engines["postgresql"])
    try:
        database.create()
    except Exception as exc:
        unreachable("postgresql", exc)
    yield database
    database.drop()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Worker processes started by the test, killed at teardown if still running."""
    processes: list[WorkerProcess] = []
    yield processes
    for worker in processes:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_worker(
    started: list[WorkerProcess],
    tmp_path: Path,
    rabbit: Rabbit,
    *,
    database_url: str,
    queue: str,
    port: int,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    log_path = tmp_path / f"worker-{len(started) + 1}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "broker_app:inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
                "--metrics-port",
                str(port),
                *extra,
            ],
            cwd=TESTS_DIR,
            env={**os.environ, "BROKER_APP_DATABASE_URL": database_url, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    worker = WorkerProcess(f"worker-{len(started) + 1}", process, log_path)
    started.append(worker)
    return worker


def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on the worker's endpoint: (status, body); (0, why) while it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except (urllib.error.URLError, ConnectionError) as error:
        return 0, str(error)


def wait_for_status(port: int, path: str, status: int, worker: WorkerProcess) -> str:
    """Poll ``path`` until it answers ``status``; its body then."""
    seen: list[tuple[int, str]] = []

    def answered() -> bool:
        assert worker.process.poll() is None, f"the worker exited\n{worker.tail()}"
        seen.append(get(port, path))
        return seen[-1][0] == status

    try:
        wait_until(answered, f"{path} to answer {status}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer {seen[-1:]}\n{worker.tail()}") from None
    return seen[-1][1]


def samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The scraped samples: (name, labels) -> value."""
    status, body = get(port, "/metrics")
    assert status == HTTPStatus.OK, body
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def scraped(port: int, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, got), value in samples(port).items()
        if sample == name and set(labels.items()) <= got
    )


def publish_foreign(
    rabbit: Rabbit, queue: str, messages: list[tuple[str | None, str]], message_type: str = "op"
) -> None:
    """Publish (message id, ref) pairs with pika, as a producer that is not this library."""
    url = rabbit.url.rstrip("/") + "/%2F"  # pika spells the default vhost "%2F"
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for message_id, ref in messages:
            channel.basic_publish(
                "",
                queue,
                json.dumps({"ref": ref}).encode(),
                pika.BasicProperties(
                    message_id=message_id,
                    type=message_type,
                    content_type="application/json",
                    delivery_mode=2,
                ),
            )
    finally:
        connection.close()


def test_metrics_count_real_deliveries_and_duplicates_from_a_foreign_producer(
    own_db: OwnDatabase, rabbit: Rabbit, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    queue = rabbit.queue()
    declare(rabbit, queue)
    port = free_port()
    worker = start_worker(
        started, tmp_path, rabbit, database_url=own_db.url, queue=queue, port=port
    )
    wait_for_status(port, "/readyz", HTTPStatus.OK, worker)
    ids = [str(uuid.uuid4()) for _ in range(3)]  # not UUIDv7: a foreign producer's ids

    publish_foreign(rabbit, queue, [(ids[0], "a"), (ids[1], "b"), (ids[2], "c")])
    publish_foreign(rabbit, queue, [(ids[0], "a"), (ids[1], "b")])  # the same ids again

    by = {"inbox_handler": HANDLER, "inbox_message_type": "op"}
    wait_until(
        lambda: scraped(port, "inbox_duplicates_total", **by) == 2,
        "two duplicates on /metrics",
    )
    assert scraped(port, "inbox_processed_total", **by) == 3
    assert scraped(port, "inbox_failures_total") == 0
    assert scraped(port, "inbox_handler_duration_seconds_count", **by) == 5
    assert scraped(port, "inbox_claim_duration_seconds_count", inbox_handler=HANDLER) == 5
    assert (
        scraped(
            port,
            "messaging_client_consumed_messages_total",
            messaging_destination_name=queue,
            messaging_system="rabbitmq",
        )
        == 5
    )
    assert scraped(port, "messaging_process_duration_seconds_count") == 5

    publish_foreign(rabbit, queue, [(None, "no id")])
    publish_foreign(rabbit, queue, [(str(uuid.uuid4()), "u")], message_type="nobody-takes-it")
    reason = "inbox_dead_letter_reason"
    wait_until(lambda: scraped(port, "inbox_dead_letters_total") == 2, "two dead letters")
    assert scraped(port, "inbox_dead_letters_total", **{reason: "missing-message-id"}) == 1
    assert scraped(port, "inbox_dead_letters_total", **{reason: "unhandled-type"}) == 1
    status, body = get(port, "/healthz")
    assert (status, body) == (HTTPStatus.OK, "ok\n")
    assert get(port, "/nothing")[0] == HTTPStatus.NOT_FOUND
    assert worker.terminate() == 0


def test_readyz_says_503_while_the_database_is_gone_and_200_once_it_is_back(
    own_db: OwnDatabase, rabbit: Rabbit, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    queue = rabbit.queue()
    port = free_port()
    worker = start_worker(
        started, tmp_path, rabbit, database_url=own_db.url, queue=queue, port=port
    )
    assert wait_for_status(port, "/readyz", HTTPStatus.OK, worker) == "ready\n"

    own_db.drop()
    gone = wait_for_status(port, "/readyz", HTTPStatus.SERVICE_UNAVAILABLE, worker)
    assert gone.startswith("database: "), gone
    assert own_db.name in gone  # which database, on one line
    assert len(gone.strip().splitlines()) == 1
    assert get(port, "/healthz")[0] == HTTPStatus.OK  # alive: restarting it would not help

    own_db.create()
    assert wait_for_status(port, "/readyz", HTTPStatus.OK, worker) == "ready\n"
    assert worker.terminate() == 0


def test_readyz_says_503_when_the_inbox_table_is_missing(
    own_db: OwnDatabase, rabbit: Rabbit, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    queue = rabbit.queue()
    port = free_port()
    worker = start_worker(
        started, tmp_path, rabbit, database_url=own_db.url, queue=queue, port=port
    )
    wait_for_status(port, "/readyz", HTTPStatus.OK, worker)
    engine = create_engine(own_db.url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE inbox_message"))
    finally:
        engine.dispose()

    missing = wait_for_status(port, "/readyz", HTTPStatus.SERVICE_UNAVAILABLE, worker)
    assert missing.startswith("database: table inbox_message does not exist"), missing
    assert worker.terminate() == 0


def test_healthz_says_503_while_the_loop_is_stuck_longer_than_its_timeout(
    own_db: OwnDatabase, rabbit: Rabbit, tmp_path: Path, started: list[WorkerProcess]
) -> None:
    queue = rabbit.queue()
    declare(rabbit, queue)
    started_file = tmp_path / "started"
    port = free_port()
    worker = start_worker(
        started,
        tmp_path,
        rabbit,
        database_url=own_db.url,
        queue=queue,
        port=port,
        extra=("--healthz-timeout", "1"),
        env={"BROKER_APP_SLOW": "6", "BROKER_APP_STARTED_FILE": str(started_file)},
    )
    wait_for_status(port, "/healthz", HTTPStatus.OK, worker)
    publish_foreign(rabbit, queue, [(str(uuid.uuid4()), "slow")])
    wait_until(started_file.exists, "the slow handler to start")

    stuck = wait_for_status(port, "/healthz", HTTPStatus.SERVICE_UNAVAILABLE, worker)
    assert stuck.startswith("stale: the consume loop has not turned for"), stuck
    assert wait_for_status(port, "/healthz", HTTPStatus.OK, worker) == "ok\n"
    assert worker.terminate() == 0


def test_without_the_otel_extra_the_worker_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if the otel extra were not installed
        from inbox.broker.cli import worker_main
        sys.exit(worker_main(sys.argv[1:]))
        """
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "broker_app:inbox",
            "--broker",
            "amqp://guest:guest@127.0.0.1:1//",
            "--queue",
            "q",
            "--metrics-port",
            "9",
        ],
        cwd=TESTS_DIR,
        env={**os.environ, "BROKER_APP_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "inbox-worker: error: --metrics-port needs the otel extra (missing prometheus_client): "
        "pip install 'sqlalchemy-inbox[otel]'"
    )


def test_a_metrics_port_in_use_is_a_one_line_usage_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                *worker_command(),
                "broker_app:inbox",
                "--broker",
                "amqp://guest:guest@127.0.0.1:1//",
                "--queue",
                "q",
                "--metrics-port",
                str(port),
            ],
            cwd=TESTS_DIR,
            env={**os.environ, "BROKER_APP_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"},
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"inbox-worker: error: --metrics-port {port} on 127.0.0.1: Address already in use"
    )


@dataclass
class Probe:
    heartbeat: float
    consuming: bool


def test_readyz_names_a_broker_it_does_not_consume_from_and_healthz_a_stale_loop() -> None:
    # The broker side without stopping the shared RabbitMQ: the worker's two flags directly.
    probe = Probe(heartbeat=time.monotonic() - 120, consuming=False)
    server = HealthServer(probe, "127.0.0.1", 0, database=lambda: None, metrics=None)
    server.start()
    try:
        assert get(server.port, "/readyz") == (
            HTTPStatus.SERVICE_UNAVAILABLE,
            "broker: not consuming (connecting, or reconnecting)\n",
        )
        status, body = get(server.port, "/healthz")
        assert status == HTTPStatus.SERVICE_UNAVAILABLE
        assert body.startswith("stale: the consume loop has not turned for 12")
        assert get(server.port, "/metrics")[0] == HTTPStatus.NOT_FOUND  # no exposition given
        probe.heartbeat, probe.consuming = time.monotonic(), True
        assert get(server.port, "/readyz") == (HTTPStatus.OK, "ready\n")
        assert get(server.port, "/healthz") == (HTTPStatus.OK, "ok\n")
    finally:
        server.stop()


def test_a_database_check_that_hangs_makes_later_probes_unready_without_waiting() -> None:
    release = threading.Event()

    def hanging() -> str | None:
        release.wait(30)
        return None

    probe = Probe(heartbeat=time.monotonic(), consuming=True)
    server = HealthServer(probe, "127.0.0.1", 0, database=hanging, metrics=None)
    server.start()
    first: list[tuple[int, str]] = []
    waiting = threading.Thread(target=lambda: first.append(get(server.port, "/readyz")))
    try:
        waiting.start()
        wait_until(server._checking.locked, "the first check to start")
        assert get(server.port, "/readyz") == (
            HTTPStatus.SERVICE_UNAVAILABLE,
            "database: the previous check has not finished (the database does not answer)\n",
        )
        release.set()
        waiting.join(30)
        assert first == [(HTTPStatus.OK, "ready\n")]
    finally:
        release.set()
        server.stop()
