"""``inbox status``, ``inbox show`` and ``inbox release`` against real databases: the claim
keys found as the core computes them, a release re-running exactly the released handler."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect

from inbox import Inbox, Message
from inbox.admin import admin_main
from inbox.message import KEY_NAMESPACE
from inbox.result import Outcome
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_effect, inbox_message, outbox_message

NOW = dt.datetime.now(dt.UTC)


def run(
    db: Database, *argv: str, confirm: Callable[[str], bool] | None = None
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main([*argv, "--database-url", db.url], stdout=out, stderr=err, confirm=confirm)
    return code, out.getvalue(), err.getvalue()


def make_inbox(db: Database) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.apply")

    @inbox.handler("order.created", name="ops.audit")
    def audit(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.audit")

    @inbox.handler(
        "order.created", name="billing.invoice", key=lambda m: f"invoice-{m.body['ref']}"
    )
    def invoice(message: Message, session: Session) -> None:
        record_effect(message, session, "billing.invoice")

    return inbox


def order(ref: str, idempotency_key: str | None = None) -> Message:
    headers = {"idempotency-key": idempotency_key} if idempotency_key else None
    return Message.new("order.created", {"ref": ref}, headers)


def handlers_shown(out: str) -> list[str]:
    return [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]


def test_show_finds_each_claim_under_the_key_the_core_used(db: Database) -> None:
    inbox = make_inbox(db)
    plain = order("42")
    keyed = order("43", idempotency_key="order-created-43")
    inbox.process(plain)
    inbox.process(keyed)

    code, out, _ = run(db, "show", str(plain.id))
    assert code == 0
    assert sorted(handlers_shown(out)) == ["ops.apply", "ops.audit"]
    assert f"claim key {plain.id}, the message id" in out

    code, out, _ = run(db, "show", "invoice-42")  # what billing.invoice's key= returned
    assert code == 0
    assert handlers_shown(out) == ["billing.invoice"]

    code, out, _ = run(db, "show", "order-created-43", "--handler", "ops.apply")
    assert code == 0
    assert handlers_shown(out) == ["ops.apply"]
    assert "the business key 'order-created-43'" in out

    code, out, _ = run(db, "show", str(keyed.id))  # claimed under its idempotency key
    assert code == 3
    assert out.splitlines() == [
        f"no claim for the message id or the business key {str(keyed.id)!r}",
        "a handler claims under the message id only without key= and without an "
        "idempotency-key header; otherwise under that key, and the claims table holds no "
        "message id beside it",
        "the key is in the worker's log lines for the message ('under claim key K'; at "
        "--log-level DEBUG for a handler that committed), in its dead letter's "
        "x-inbox-claim-keys and idempotency-key headers (inbox dlq show ID), or what your "
        "key= function returns for the message: inbox show KEY",
        "to look in the dead letters: inbox show ID --queue QUEUE",
    ]


def test_a_business_key_that_looks_like_a_uuid(db: Database) -> None:
    inbox = make_inbox(db)
    key = str(uuid.uuid4())
    inbox.process(order("44", idempotency_key=key))

    code, out, _ = run(db, "show", key, "--key", "--handler", "ops.apply")
    assert code == 0
    assert f"claim key {uuid.uuid5(KEY_NAMESPACE, key)}, the business key" in out
    code, out, _ = run(db, "show", key, "--handler", "ops.apply")  # both readings are tried
    assert code == 0


def test_show_json(db: Database) -> None:
    inbox = make_inbox(db)
    message = order("45")
    inbox.process(message)

    code, out, _ = run(db, "show", str(message.id), "--handler", "ops.apply", "--json")

    assert code == 0
    found = json.loads(out)
    [claim] = found["claims"]
    assert claim["handler"] == "ops.apply"
    assert claim["key"] == {"key": str(message.id), "how": "message id"}
    assert dt.datetime.fromisoformat(claim["processed_at"]) <= dt.datetime.now(dt.UTC)
    assert found["effects"] == []


def add_effect(db: Database, claim_key: uuid.UUID, handler: str, step: str, status: str) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_effect),
            {
                "effect_key": uuid.uuid4(),
                "claim_key": claim_key,
                "handler": handler,
                "step": step,
                "status": status,
                "attempts": 1,
                "result": "null" if status == "done" else None,  # a call that returned None
                "error": "TimeoutError: no answer" if status == "failed" else None,
                "started_at": NOW,
                "updated_at": NOW,
            },
        )


def test_release_then_a_redelivery_runs_exactly_that_handler_again(db: Database) -> None:
    inbox = make_inbox(db)
    message = order("46")
    inbox.process(message)
    add_effect(db, message.id, "ops.apply", "charge", "done")
    add_effect(db, message.id, "ops.audit", "notify", "done")

    code, out, err = run(db, "release", str(message.id), "--handler", "ops.apply", "--yes")

    assert (code, err) == (0, "")
    assert "ops.apply: processed at " in out
    assert "effect ops.apply step 'charge': done" in out
    assert out.endswith(
        "released: 1 claim(s) and 1 effect record(s) of ops.apply deleted; the next delivery "
        "runs it again\n"
    )
    result = inbox.process(message)  # the redelivery
    assert result.outcomes == {
        "ops.apply": Outcome.PROCESSED,
        "ops.audit": Outcome.DUPLICATE,
        "billing.invoice": Outcome.DUPLICATE,
    }
    assert db.effect_counts() == {
        ("46", "ops.apply"): 2,
        ("46", "ops.audit"): 1,
        ("46", "billing.invoice"): 1,
    }
    with db.engine.connect() as connection:
        left = connection.execute(select(inbox_effect.c.handler)).scalars().all()
    assert left == ["ops.audit"]


def test_release_asks_and_refuses_without_yes(db: Database) -> None:
    inbox = make_inbox(db)
    message = order("47")
    inbox.process(message)
    args = ("release", "invoice-47", "--handler", "billing.invoice")

    code, _, err = run(db, *args)  # no terminal to ask on
    assert code == 2
    assert err == "inbox: error: refusing to release without --yes (no terminal to ask on)\n"
    questions: list[str] = []
    code, _, err = run(db, *args, confirm=lambda q: questions.append(q) or False)
    assert code == 2
    assert questions == ["release these 1 claim(s) and 0 effect record(s)?"]
    assert db.count(inbox_message) == 3

    code, out, _ = run(db, *args, confirm=lambda q: True)

    assert code == 0
    assert db.count(inbox_message) == 2
    code, out, _ = run(db, *args, "--yes")
    assert code == 3
    assert out.startswith("nothing to release: no claim or effect record for the business key")


def test_release_for_a_handler_holding_nothing_names_those_that_do(db: Database) -> None:
    """Regression (issue 32, item 12): a mistyped --handler answered only "nothing to
    release", leaving the operator to guess the names."""
    inbox = make_inbox(db)
    message = order("48")
    inbox.process(message)
    add_effect(db, message.id, "ops.refund", "refund", "started")  # an effect, no claim

    code, out, _ = run(db, "release", str(message.id), "--handler", "ops.aply", "--yes")

    assert code == 3
    assert out.splitlines() == [
        "nothing to release: no claim or effect record for the message id or the business key "
        f"{str(message.id)!r} and handler ops.aply",
        "handlers holding claims or effect records for it: ops.apply, ops.audit, ops.refund "
        "(release one with --handler NAME)",
    ]
    assert db.count(inbox_message) == 3
    code, out, _ = run(db, "release", "no-such-key", "--handler", "ops.apply", "--yes")
    assert (code, len(out.splitlines())) == (3, 1)  # no handler holds anything: no list


def test_release_removes_the_effects_of_a_run_that_never_committed(db: Database) -> None:
    # An at-most-once effect left 'started' by a crash: the message is dead-lettered as
    # uncertain until a person releases it.
    key = uuid.uuid4()
    add_effect(db, key, "ops.apply", "charge", "started")

    code, out, _ = run(db, "release", str(key), "--handler", "ops.apply", "--yes")

    assert code == 0
    assert "released: 0 claim(s) and 1 effect record(s)" in out
    assert db.count(inbox_effect) == 0


def add_outbox_row(db: Database, attempts: int, error: str | None) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(outbox_message),
            {
                "id": uuid.uuid4(),
                "type": "order.shipped",
                "exchange": "",
                "routing_key": "orders",
                "content_type": "application/json",
                "content_encoding": "utf-8",
                "headers": "{}",
                "body": b"{}",
                "created_at": NOW - dt.timedelta(minutes=attempts),
                "attempts": attempts,
                "available_at": NOW,
                "last_error": error,
            },
        )


def test_status_counts_claims_outbox_rows_and_unfinished_effects(db: Database) -> None:
    inbox = make_inbox(db)
    for ref in ("1", "2"):
        inbox.process(order(ref))
    add_outbox_row(db, 0, None)
    add_outbox_row(db, 2, "PublishError: NOT_FOUND - no exchange 'orders'")
    add_outbox_row(db, 3, "PublishError: NOT_FOUND - no exchange 'orders'")
    add_effect(db, uuid.uuid4(), "ops.apply", "charge", "done")
    add_effect(db, uuid.uuid4(), "ops.apply", "charge", "started")
    add_effect(db, uuid.uuid4(), "ops.audit", "notify", "failed")

    code, out, _ = run(db, "status", "--json")

    assert code == 0
    report = json.loads(out)
    assert [(c["handler"], c["count"]) for c in report["claims"]] == [
        ("billing.invoice", 2),
        ("ops.apply", 2),
        ("ops.audit", 2),
    ]
    assert report["outbox"]["pending"] == 3
    assert report["outbox"]["refused"] == 2
    assert report["outbox"]["errors"] == [["PublishError: NOT_FOUND - no exchange 'orders'", 2]]
    assert report["effects"]["by_status"] == {"done": 1, "failed": 1, "started": 1}
    assert sorted(u["status"] for u in report["effects"]["unfinished"]) == ["failed", "started"]
    assert (report["size_bytes"] is None) == (db.backend == "sqlite")

    code, out, _ = run(db, "status")

    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("claims in inbox_message: 6")
    assert "  ops.apply: 2 claims, oldest " in out
    assert "outbox: 3 pending (oldest " in out
    assert "  2 x PublishError: NOT_FOUND - no exchange 'orders'" in lines
    assert "effects: 1 done, 1 failed, 1 started" in lines
    assert "  not done: ops.audit step 'notify' failed after 1 attempt(s)" in out


def test_status_without_the_outbox_and_effect_tables(db: Database) -> None:
    outbox_message.drop(db.engine)
    inbox_effect.drop(db.engine)

    code, out, _ = run(db, "status")

    assert code == 0
    assert out.splitlines()[1:] == ["outbox: no outbox table", "effects: no effect table"]


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    out, err = io.StringIO(), io.StringIO()
    url = "postgresql+psycopg://app:s3cret-pw@127.0.0.1:1/app"

    code = admin_main(["status", "--database-url", url], stdout=out, stderr=err)

    assert code == 1
    assert err.getvalue().startswith("inbox: error: OperationalError: ")
    assert err.getvalue().endswith("(database postgresql+psycopg://app:***@127.0.0.1:1/app)\n")
    assert err.getvalue().count("\n") == 1
    assert "s3cret-pw" not in err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: command"),
        (["show"], "the following arguments are required: ID-OR-KEY"),
        (["release", "x"], "the following arguments are required: --handler"),
        (["show", "", "--database-url", "sqlite://"], "the message id or key is empty"),
        (["status", "--database-url", "nope://"], "--database-url: NoSuchModuleError"),
        (["status", "--queue", "q", "--database-url", "sqlite://"], "no broker: pass --broker"),
        (["dlq", "list", "--queue", "q"], "no broker: pass --broker or set INBOX_BROKER_URL"),
        (["dlq", "replay", "--queue", "q", "--broker", "memory://"], "must be an amqp:// URL"),
        (["dlq", "replay", "--queue", "q", "--max-replays", "0"], "at least 1"),
    ],
)
def test_bad_usage_exits_2_with_one_line(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INBOX_DATABASE_URL", raising=False)
    monkeypatch.delenv("INBOX_BROKER_URL", raising=False)
    out, err = io.StringIO(), io.StringIO()

    code = admin_main(argv, stdout=out, stderr=err)

    assert code == 2
    [line] = [x for x in err.getvalue().splitlines() if x.startswith("inbox: error:")]
    assert message in line


def test_version_and_cleanup(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    assert admin_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("inbox 0.")
    assert cleanup_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("inbox-cleanup 0.")
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            {
                "message_id": uuid.uuid4(),
                "handler": "old",
                "processed_at": NOW - dt.timedelta(days=9),
            },
        )

    assert admin_main(["cleanup", "--days", "7", "--database-url", db.url, "--quiet"]) == 0

    with db.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(inbox_message)).scalar() == 0


def test_the_documented_grants_are_enough(pg_db: Database) -> None:
    inbox = make_inbox(pg_db)
    message = order("48")
    inbox.process(message)
    add_effect(pg_db, message.id, "ops.apply", "charge", "done")
    schema = pg_db.engine.url.query["options"].partition("search_path=")[2]
    role = f"inbox_admin_{uuid.uuid4().hex[:8]}"
    grants = [
        f"CREATE ROLE {role} LOGIN",
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON inbox_message, inbox_effect, outbox_message TO {role}",
        f"GRANT DELETE ON inbox_message, inbox_effect TO {role}",
    ]
    with pg_db.engine.begin() as connection:
        for grant in grants:
            connection.execute(text(grant))
    as_role = pg_db.engine.url.set(username=role).render_as_string(hide_password=False)
    try:
        for argv in (
            ["status"],
            ["show", str(message.id)],
            ["release", str(message.id), "--handler", "ops.apply", "--yes"],
        ):
            out, err = io.StringIO(), io.StringIO()
            code = admin_main([*argv, "--database-url", as_role], stdout=out, stderr=err)
            assert (code, err.getvalue()) == (0, ""), argv
    finally:
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP OWNED BY {role}"))
            connection.execute(text(f"DROP ROLE {role}"))
    assert inbox.process(message).outcomes["ops.apply"] is Outcome.PROCESSED


def test_release_clears_the_records_of_real_effects_so_they_are_called_again(
    server_db: Database,
) -> None:
    inbox = Inbox(server_db.sessions)
    calls: list[uuid.UUID] = []

    @inbox.handler("order.created", name="billing.charge", key=lambda m: f"charge-{m.body['ref']}")
    def charge(message: Message, session: Session) -> None:
        inbox.effect("card", lambda key: calls.append(key) or "ok")
        record_effect(message, session, "billing.charge")

    message = order("49")
    inbox.process(message)
    code, out, _ = run(server_db, "show", "charge-49")
    assert code == 0
    assert "effect billing.charge step 'card': done, 1 attempt(s)" in out
    inbox.process(message)
    assert len(calls) == 1  # a duplicate: neither the handler nor the effect runs

    code, out, _ = run(server_db, "release", "charge-49", "--handler", "billing.charge", "--yes")

    assert code == 0
    assert "released: 1 claim(s) and 1 effect record(s) of billing.charge" in out
    inbox.process(message)
    assert len(calls) == 2
    assert calls[0] == calls[1]  # the same key: the card processor deduplicates by it


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "list", "--queue", "q", "--broker", "amqp://u:se#cret@127.0.0.1:1//"],
        ["dlq", "replay", "--queue", "q", "--broker", "amqp://u:se/cret@127.0.0.1:1//"],
        ["dlq", "purge", "--queue", "q", "--broker", "amqp://u:secret@127.0.0.1:1//"],
        [
            "status",
            "--database-url",
            "sqlite://",
            "--queue",
            "q",
            "--broker",
            "amqp://u:se#cret@h//",
        ],
        [
            "cleanup",
            "--days",
            "3",
            "--database-url",
            "sqlite://",
            "--queue",
            "q",
            "--broker",
            "amqp://u:se#cret@h//",
        ],
        ["status", "--database-url", "postgresql+psycopg://u:se@cret@127.0.0.1:1/db"],
    ],
)
def test_no_error_shows_a_password(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()

    code = admin_main(argv, stdout=out, stderr=err)

    assert code in (1, 2)
    assert "cret" not in out.getvalue() + err.getvalue()
    [line] = [x for x in err.getvalue().splitlines() if x.startswith("inbox: error:")]
    assert "percent-encode" in line or "***" in line


def test_status_counts_the_partitions_of_a_partitioned_table(pg_db: Database) -> None:
    from inbox.partitioning import create_partitioned_table, list_partitions

    inbox_message.drop(pg_db.engine)
    with pg_db.engine.begin() as connection:
        create_partitioned_table(connection, days_ahead=2)
    make_inbox(pg_db).process(order("50"))

    code, out, _ = run(pg_db, "status", "--json")

    assert code == 0
    report = json.loads(out)
    assert report["partitions"] == len(list_partitions(pg_db.engine)) >= 4
    assert report["size_bytes"] > 0
    assert sum(c["count"] for c in report["claims"]) == 3
