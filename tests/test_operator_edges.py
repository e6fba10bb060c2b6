"""The operator's commands as a new user meets them (issue 25's rough edges, issue 24's
operator safety): an unmigrated database, a closed pipe, a relay refusal, effects done
without a result, bad filters, a missing queue, usage errors, dry runs, secrets in URL query
parameters, durations out of range. Real databases and RabbitMQ."""

from __future__ import annotations

import datetime as dt
import io
import logging
import os
import re
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from kombu import Exchange as KombuExchange
from kombu import Queue as KombuQueue
from packaging.requirements import Requirement
from sqlalchemy import insert, make_url
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.relay import add_rows, make_relay, op_row

from inbox import Inbox, Message
from inbox.admin import admin_main
from inbox.outbox.relay.cli import relay_main
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_effect, inbox_message, metadata

ROOT = Path(__file__).resolve().parent.parent
NOW = dt.datetime.now(dt.UTC)


def admin(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def cleanup(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cleanup_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def unmigrated(db: Database) -> Database:
    metadata.drop_all(db.engine)
    return db


# --- an unmigrated database ------------------------------------------------------------------


def test_status_and_cleanup_on_an_unmigrated_database_name_the_migrations(db: Database) -> None:
    unmigrated(db)

    code, out, err = admin("status", "--database-url", db.url)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1, err
    assert re.match(r"inbox: error: table (\w+\.)?inbox_message does not exist: ", err)
    assert "`inbox migrate`" in err
    assert "ProgrammingError" not in err
    assert "OperationalError" not in err

    code, out, err = cleanup("--days", "30", "--database-url", db.url)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1, err
    assert re.match(r"inbox-cleanup: error: table (\w+\.)?inbox_message does not exist: ", err)
    assert "`inbox migrate`" in err


def test_inbox_migrate_creates_the_tables_then_status_works(db: Database) -> None:
    unmigrated(db)

    code, out, err = admin("migrate", "--database-url", db.url)
    assert (code, err) == (0, "")
    assert out.startswith("inbox migrate: upgraded from no inbox revision to inbox revision ")

    code, out, _ = admin("migrate", "--database-url", db.url)
    assert code == 0
    assert out.startswith("inbox migrate: already at inbox revision ")
    code, out, err = admin("status", "--database-url", db.url)
    assert (code, err) == (0, "")
    assert out.startswith("claims in inbox_message: 0")


def test_alembic_upgrade_head_with_the_packaged_environment(tmp_path: Path) -> None:
    """The two-line alembic.ini docs/migrations.md gives an application without an alembic
    history of its own, run in a folder outside the checkout."""
    (tmp_path / "alembic.ini").write_text("[alembic]\nscript_location = inbox:migrations\n")
    url = f"sqlite:///{tmp_path / 'app.db'}"
    env = {**os.environ, "INBOX_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

    code, out, _ = admin("status", "--database-url", url)
    assert code == 0
    assert "effects: none" in out


# --- a closed pipe ---------------------------------------------------------------------------


def run_into_closed_pipe(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with a standard output whose reader has already gone (``| head -1`` once
    head has exited): every write fails with EPIPE."""
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
        os.close(read)
    _, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, "", err)


def test_a_closed_pipe_ends_status_and_cleanup_quietly(db: Database) -> None:
    Inbox(db.sessions)  # nothing to process: the report has its lines anyway
    for command in (
        f"from inbox.admin import admin_main; raise SystemExit(admin_main("
        f"['status', '--database-url', {db.url!r}]))",
        f"from inbox.retention.cli import cleanup_main; raise SystemExit(cleanup_main("
        f"['--days', '30', '--dry-run', '--database-url', {db.url!r}]))",
    ):
        done = run_into_closed_pipe(command)
        assert (done.returncode, done.stderr) == (0, "")


def test_a_closed_pipe_ends_dlq_list_quietly(rabbit: Rabbit) -> None:
    queue = rabbit.queue("orders")
    dead = KombuQueue(f"{queue}.dlq", KombuExchange(""), routing_key=f"{queue}.dlq")
    with rabbit.connection() as connection:
        producer = connection.Producer()
        for n in range(3):
            producer.publish(
                {"n": n},
                routing_key=f"{queue}.dlq",
                declare=[dead],
                message_id=str(uuid.uuid4()),
                headers={"x-inbox-reason": "handler-failed"},
            )

    done = run_into_closed_pipe(
        f"from inbox.admin import admin_main; raise SystemExit(admin_main("
        f"['dlq', 'list', '--queue', {queue!r}, '--broker', {rabbit.url!r}]))"
    )

    assert (done.returncode, done.stderr) == (0, "")
    assert rabbit.depth(f"{queue}.dlq") == 3  # listed, left in place


# --- the relay's refusal ---------------------------------------------------------------------


def test_a_refused_row_names_its_exchange_and_routing_key(
    pg_db: Database, rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> None:
    missing = rabbit.queue("nowhere")
    add_rows(pg_db.engine, [op_row(missing, "stuck")])
    caplog.set_level(logging.WARNING, logger="inbox")

    with make_relay(pg_db, rabbit, max_retry_delay=0.5) as relay:
        relay.drain()

    where = f"the default exchange '' with routing key {missing!r}"
    assert any(where in record.getMessage() for record in caplog.records), caplog.text
    code, out, _ = admin("status", "--database-url", pg_db.url)
    assert code == 0
    [error] = [line for line in out.splitlines() if "NO_ROUTE" in line]
    assert where in error


# --- effects done without a result -----------------------------------------------------------


def add_effect(db: Database, claim_key: uuid.UUID, step: str, result: str | None) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_effect),
            {
                "effect_key": uuid.uuid4(),
                "claim_key": claim_key,
                "handler": "sms.notify",
                "step": step,
                "status": "done",
                "attempts": 1,
                "result": result,
                "error": None,
                "started_at": NOW,
                "updated_at": NOW,
            },
        )


def test_an_effect_done_without_its_result_is_shown_as_such(db: Database) -> None:
    message = Message.new("order.created", {"ref": "9"})
    add_effect(db, message.id, "sms.lost", None)  # the call made, its result not stored
    add_effect(db, message.id, "sms.none", "null")  # the call returned None: plain done

    code, out, _ = admin("status", "--database-url", db.url)
    assert code == 0
    assert "effects: 1 done, 1 done without result" in out
    [line] = [x for x in out.splitlines() if "sms.lost" in x]
    assert line.startswith("  done without result: sms.notify step 'sms.lost' after 1 attempt")
    assert "sms.none" not in out

    code, out, _ = admin("show", str(message.id), "--database-url", db.url)
    assert code == 3  # effect records, but no claim
    assert "step 'sms.lost': done without result, 1 attempt(s)" in out
    assert "step 'sms.none': done, 1 attempt(s)" in out


# --- inbox show with the id of a message sent with an idempotency key ------------------------


def test_show_by_the_id_of_a_keyed_message_says_how_to_find_its_claims(db: Database) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.apply")

    keyed = Message.new("order.created", {"ref": "7"}, {"idempotency-key": "order-7"})
    inbox.process(keyed)

    code, out, _ = admin("show", str(keyed.id), "--database-url", db.url)
    assert code == 3
    assert "otherwise under that key" in out
    assert "inbox show KEY" in out
    code, out, _ = admin("show", "order-7", "--database-url", db.url)
    assert code == 0
    assert out.startswith("ops.apply: processed at ")


def test_dlq_list_shows_the_idempotency_key_of_a_dead_letter(rabbit: Rabbit) -> None:
    queue = rabbit.queue("keyed")
    dead = KombuQueue(f"{queue}.dlq", KombuExchange(""), routing_key=f"{queue}.dlq")
    with rabbit.connection() as connection:
        connection.Producer().publish(
            {"n": 1},
            routing_key=f"{queue}.dlq",
            declare=[dead],
            message_id=str(uuid.uuid4()),
            headers={"x-inbox-reason": "handler-failed", "idempotency-key": "order-8"},
        )

    code, out, err = admin("dlq", "list", "--queue", queue, "--broker", rabbit.url)

    assert (code, err) == (0, ""), err
    assert " key=order-8 " in out


# --- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["dlq", "purge", "--queue", "q", "--reason", "bogus"], "unknown reason 'bogus'"),
        (["dlq", "replay", "--queue", "q", "--older-than", "9999999999d"], "at most 36500d"),
        (["dlq", "purge", "--queue", "q", "--older-than", "100000000000000000000s"], "at most"),
        (["dlq", "replay", "--queue", "q", "--older-than", "36501d"], "at most 36500d"),
        (["nosuch"], "invalid choice: 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], expected: str) -> None:
    code, out, err = admin(*argv, "--broker", "amqp://guest:guest@127.0.0.1:5672//")

    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("inbox: error: ")
    assert expected in line
    assert line.endswith("--help)")
    assert "usage:" not in err

    code, _, err = admin("show")
    assert code == 2
    assert err == (
        "inbox: error: the following arguments are required: ID-OR-KEY (see inbox show --help)\n"
    )


def test_the_other_commands_usage_errors_are_one_line_too() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert relay_main(["--batch-size", "0"], stdout=out, stderr=err) == 2
    [line] = err.getvalue().splitlines()
    assert line.startswith("inbox-relay: error: argument --batch-size")

    code, _, err_text = cleanup("--days", "zero")
    assert code == 2
    [line] = err_text.splitlines()
    assert line == (
        "inbox-cleanup: error: argument --days: expected a whole number, got 'zero' "
        "(see inbox-cleanup --help)"
    )

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from inbox.broker.cli import worker_main; raise SystemExit(worker_main())",
            "app:inbox",
            "--prefetch",
            "-1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("inbox-worker: error: argument --prefetch")


def test_a_dlq_replay_older_than_a_century_is_refused_before_the_broker_is_asked() -> None:
    # No broker runs on port 1: a usage error must come before any connection attempt.
    code, _, err = admin(
        "dlq",
        "replay",
        "--queue",
        "q",
        "--older-than",
        "9999999999d",
        "--broker",
        "amqp://x@127.0.0.1:1//",
    )
    assert code == 2
    assert "OverflowError" not in err


def test_status_with_a_queue_that_does_not_exist_still_reports_the_rest(
    db: Database, rabbit: Rabbit
) -> None:
    code, out, err = admin(
        "status",
        "--queue",
        rabbit.queue("nosuch"),
        "--broker",
        rabbit.url,
        "--database-url",
        db.url,
    )

    assert (code, err) == (0, "")
    assert out.startswith("claims in inbox_message: 0")
    assert out.splitlines()[-1] == (
        f"dead letters in {rabbit.queue('nosuch')}.dlq: no such queue (is it the worker's --queue?)"
    )


# --- cleanup's lines -------------------------------------------------------------------------


def test_a_dry_run_says_what_it_would_delete_without_batches(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [
                {
                    "message_id": uuid.uuid4(),
                    "handler": "h",
                    "processed_at": NOW - dt.timedelta(days=40),
                }
                for _ in range(3)
            ],
        )

    code, out, _ = cleanup("--days", "30", "--dry-run", "--database-url", db.url)

    assert code == 0
    assert out.startswith("inbox-cleanup: dry run: would delete 3 claims processed before ")
    assert "batches" not in out


def test_secrets_in_query_parameters_never_reach_the_output(pg_db: Database) -> None:
    """Several databases: each line names its URL, query string included (issue 24, 10)."""
    base = make_url(pg_db.url)
    first = base.update_query_dict({"password": "s3cret-one"})
    second = base.update_query_dict({"sslpassword": "s3cret-two", "application_name": "ops"})
    urls = [u.render_as_string(hide_password=False) for u in (first, second)]
    unreachable = base.set(port=1).update_query_dict({"password": "s3cret-three"})

    code, out, err = cleanup(
        "--days",
        "30",
        "--dry-run",
        *(arg for url in urls for arg in ("--database-url", url)),
        "--database-url",
        unreachable.render_as_string(hide_password=False),
    )

    assert code == 1  # the third database cannot be reached
    assert len(out.splitlines()) == 2
    assert "application_name=ops" in out
    assert "password=***" in out
    assert "sslpassword=***" in out
    assert err.count("\n") == 1
    for secret in ("s3cret-one", "s3cret-two", "s3cret-three"):
        assert secret not in out + err

    code, out, err = admin("status", "--database-url", pg_db.url, f"extra?token={'t0ken'}")
    assert code == 2
    assert "t0ken" not in out + err


# --- the documented extras -------------------------------------------------------------------


def test_the_faststream_extra_brings_the_faststream_command() -> None:
    """docs/faststream.md runs an app with `faststream run`, which needs FastStream's `cli`
    extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [faststream] = [Requirement(r) for r in extras["faststream"] if r.startswith("faststream")]
    assert "cli" in faststream.extras
    done = subprocess.run(
        [sys.executable, "-m", "faststream", "run", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
