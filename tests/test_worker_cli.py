"""``inbox-worker``: exit codes, one-line errors, and one log line per failure and dead letter."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from kombu import Queue as KombuQueue
from support.rabbit import Rabbit

from inbox._amqp.connections import BROKER_URL_ENV
from inbox.broker import Publisher
from inbox.broker.cli import worker_main

APP = """
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from inbox import Inbox
    from inbox.schema import metadata

    engine = sa.create_engine("sqlite:///{db}")
    metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))
    not_an_inbox = 42


    def make_inbox():
        return inbox


    def broken_factory():
        raise RuntimeError("no config")


    @inbox.handler("op", name="ops.fail")
    def fail(message, session):
        raise ValueError("card declined for " + str(message.body["ref"]))


    @inbox.handler("note", name="ops.note")
    def note(message, session):
        pass


    # Misconfigured: the claim would commit on its own, without the handler's writes.
    autocommit_inbox = Inbox(
        sessionmaker(sa.create_engine("sqlite:///{db}", isolation_level="AUTOCOMMIT"))
    )


    @autocommit_inbox.handler("note", name="ops.note")
    def note_too(message, session):
        pass
"""


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cli_app.py").write_text(textwrap.dedent(APP.format(db=tmp_path / "app.db")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "cli_app", raising=False)
    monkeypatch.delenv(BROKER_URL_ENV, raising=False)
    return tmp_path


def _path_with(app_dir: Path) -> str:
    """PYTHONPATH for a subprocess: the app folder, then whatever the tests run with."""
    return os.pathsep.join([str(app_dir), *filter(None, [os.environ.get("PYTHONPATH")])])


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = worker_main(list(argv), stderr=err)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cli_app", "--broker", "memory://", "--queue", "q"], "expected MODULE:ATTRIBUTE"),
        (["no_such_module:inbox", "--broker", "memory://", "--queue", "q"], "cannot import"),
        (["cli_app:nope", "--broker", "memory://", "--queue", "q"], "has no attribute 'nope'"),
        (["cli_app:not_an_inbox", "--broker", "memory://", "--queue", "q"], "is a int, not an"),
        (["cli_app:inbox", "--queue", "q"], f"no broker: pass --broker or set {BROKER_URL_ENV}"),
        (["cli_app:inbox", "--broker", "memory://"], "--queue"),
        (
            ["cli_app:inbox", "--broker", "memory://", "--queue", "q", "--prefetch", "0"],
            "between 1",
        ),
        (["cli_app:inbox", "--broker", "memory://", "--queue", "q", "--max-tries", "x"], "whole"),
        (
            ["cli_app:inbox", "--broker", "memory://", "--queue", "q", "--retry-delays", "1,-5"],
            "expected seconds",
        ),
        (["cli_app:inbox", "--broker", "memory://", "--queue", "q", "--queue", "q"], "repeat"),
        (["cli_app:inbox", "--broker", "nosuch://x", "--queue", "q"], "nosuch"),
        (["cli_app:inbox", "--broker", "amqp://u:se#cret@h//", "--queue", "q"], "percent-encode"),
        (["cli_app:broken_factory", "--broker", "memory://", "--queue", "q"], "RuntimeError"),
    ],
)
def test_bad_usage_exits_2_with_one_error_line(
    app_dir: Path, argv: list[str], message: str
) -> None:
    code, err = run(*argv)

    assert code == 2
    assert "cret@" not in err
    [line] = [x for x in err.splitlines() if x.startswith("inbox-worker: error:")]
    assert message in line
    assert "Traceback" not in err


def test_a_factory_attribute_is_called_for_the_inbox(app_dir: Path) -> None:
    code, err = run(
        "cli_app:make_inbox",
        "--broker",
        "amqp://u:pw@127.0.0.1:1//",
        "--queue",
        "q",
        "--connect-retries",
        "0",
    )
    assert code == 1  # got past loading the inbox, then failed on the unreachable broker
    assert "broker amqp://u:**@127.0.0.1:1//" in err


def test_an_unreachable_broker_exits_1_with_one_line_and_no_password(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BROKER_URL_ENV, "amqp://guest:s3cret-pw@127.0.0.1:1//")
    code, err = run("cli_app:inbox", "--queue", "q", "--connect-retries", "0")

    assert code == 1
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[-1].startswith("inbox-worker: error: broker amqp://guest:**@127.0.0.1:1//: ")
    assert "s3cret-pw" not in err
    assert "Traceback" not in err


def test_the_worker_logs_one_line_per_failure_and_dead_letter_and_exits_0_on_sigterm(
    app_dir: Path, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    log = app_dir / "worker.log"
    script = Path(sys.executable).with_name("inbox-worker")
    command = (
        [str(script)]
        if script.exists()
        else [
            sys.executable,
            "-c",
            "import sys; from inbox.broker.cli import worker_main; sys.exit(worker_main())",
        ]
    )
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                *command,
                "cli_app:inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
                "--max-tries",
                "2",
                "--retry-delays",
                "0.1",
                "--stats-interval",
                "3600",
            ],
            stderr=stderr,
            cwd=app_dir,
            env={**os.environ, "PYTHONPATH": _path_with(app_dir)},
        )
        try:
            deadline = time.monotonic() + 30
            while rabbit.depth(queue) == 0 and "consuming" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            with Publisher(rabbit.url, routing_key=queue) as publisher:
                publisher.publish("op", {"ref": "r1"})
            while rabbit.depth(f"{queue}.dlq") == 0:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text()
    assert "Traceback" not in text
    failures = [x for x in text.splitlines() if "try 1/2 failed" in x]
    dead = [x for x in text.splitlines() if "dead-lettered to" in x]
    assert len(failures) == 1
    assert "ValueError: card declined for r1" in failures[0]
    assert len(dead) == 1
    assert len([x for x in text.splitlines() if "card declined" in x]) == 2
    assert "handler-failed after 2 tries" in dead[0]
    # Per delivery: both acked (the retry's and the dead letter's); per handler run: none
    # committed.
    assert (
        "worker stopped: deliveries=2 acked=2 failed_tries=2 retried=1 dead_lettered=1 "
        "(handler-failed=1) requeued=0; handler runs: processed=0 duplicates=0"
    ) in text


@pytest.fixture
def signals_restored() -> Iterator[None]:
    """worker_main installs SIGTERM/SIGINT handlers in this process: put pytest's back.
    A worker that never stops is interrupted after 30 s, failing the test, not hanging it."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def too_long(signum: int, frame: object) -> None:
        raise TimeoutError("the worker did not stop by itself within 30 s")

    previous_alarm = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_alarm)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_misconfigured_session_factory_stops_the_worker_with_exit_3_and_requeues(
    app_dir: Path, signals_restored: None
) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    with Connection("memory://") as connection, connection.channel() as channel:
        KombuQueue(queue)(channel).declare()
    with Publisher("memory://", routing_key=queue) as publisher:
        message_id = publisher.publish("note", {"ref": "r1"})

    code, err = run("cli_app:autocommit_inbox", "--broker", "memory://", "--queue", queue)

    # Not a message failure: no retry, no dead letter, the message back in its queue.
    assert code == 3, err
    [line] = [x for x in err.splitlines() if x.startswith("inbox-worker: ")]
    assert line.startswith("inbox-worker: configuration error: SessionConfigurationError: ")
    assert "AUTOCOMMIT" in line
    assert "Traceback" not in err
    assert "retry in" not in err
    assert "dead-lettered" not in err
    with Connection("memory://") as connection, connection.SimpleQueue(queue) as back:
        again = back.get(timeout=1)
        assert again.properties["message_id"] == str(message_id)
        again.ack()
        with pytest.raises(back.Empty):
            connection.SimpleQueue(f"{queue}.dlq").get(timeout=0.1)


def test_each_skipped_duplicate_is_logged_at_info_and_counted_under_inbox_worker(
    app_dir: Path, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    log = app_dir / "worker.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from inbox.broker.cli import worker_main; sys.exit(worker_main())",
                "cli_app:inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
            ],
            stderr=stderr,
            cwd=app_dir,
            env={**os.environ, "PYTHONPATH": _path_with(app_dir)},
        )
        try:
            deadline = time.monotonic() + 30
            while "consuming" not in log.read_text():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            with Publisher(rabbit.url, routing_key=queue) as publisher:
                message_id = publisher.publish("note", {"ref": "r1"})
                publisher.publish("note", {"ref": "r1"}, message_id=message_id)
                publisher.publish("note", {"ref": "r1"}, message_id=message_id)
            while log.read_text().count("skipped (duplicate)") < 2:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text()
    skipped = [x for x in text.splitlines() if "skipped (duplicate)" in x]
    assert len(skipped) == 2
    assert all(f" INFO inbox.worker: message {message_id}: ops.note" in x for x in skipped)
    assert "duplicates=2" in text.splitlines()[-1]
