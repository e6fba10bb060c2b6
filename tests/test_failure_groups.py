"""Failure groups (issue 34 item 1): the fingerprint of a dead letter from the worker's
headers, ``inbox dlq groups`` on RabbitMQ, and ``inbox dlq replay --group`` taking one group
and nothing else."""

from __future__ import annotations

import io
import json

import pytest
from console_support import dead_letter, declare_queues
from support.databases import Database
from support.rabbit import Rabbit

from inbox.admin.cli import admin_main
from inbox.errors import ConfigurationError
from inbox.operations._dead_letters import DeadLetterRecord, dead_letter_queue
from inbox.operations._failure_groups import fingerprint_of, groups, normalised
from inbox.operations._filters import failure_group


def record(
    error: str, *, handlers: str = "ops.apply", reason: str = "handler-failed"
) -> DeadLetterRecord:
    headers = {
        "x-inbox-error": error,
        "x-inbox-failed-handlers": handlers,
        "x-inbox-reason": reason,
        "x-inbox-dead-lettered-at": "2026-01-02T03:04:05+00:00",
    }
    return DeadLetterRecord.of({"message_id": error}, headers, b"{}")


def test_ids_hashes_and_numbers_are_normalised_and_words_kept() -> None:
    assert (
        normalised("order 17 for 0b7c3a1e-1234-4abc-9def-0123456789ab at 0x7ff: deadbeef01  off")
        == "order <n> for <id> at <hex>: <hex> off"
    )
    assert normalised("card declined (decade)") == "card declined (decade)"  # hex-ish words stay
    assert normalised("sha256:0123abcd ref 2.5") == "<id> ref <n>"


def test_the_fingerprint_is_reason_handlers_exception_and_normalised_text() -> None:
    first = fingerprint_of(record("ops.apply: LookupError: order 7 not found"))
    assert (first.reason, first.handlers, first.exception_type, first.message) == (
        "handler-failed",
        ("ops.apply",),
        "LookupError",
        "order <n> not found",
    )
    assert fingerprint_of(record("ops.apply: LookupError: order 8 not found")).id == first.id
    # Any part that differs is another group.
    assert fingerprint_of(record("ops.apply: KeyError: order 8 not found")).id != first.id
    assert fingerprint_of(record("ops.apply: LookupError: order 8 gone")).id != first.id
    other = record("other: LookupError: order 8 not found", handlers="other")
    assert fingerprint_of(other).id != first.id
    poison = fingerprint_of(
        record("undecodable body: not JSON", handlers="", reason="invalid-body")
    )
    assert (poison.exception_type, poison.message) == (None, "undecodable body: not JSON")
    assert failure_group(first.id) == first.id
    with pytest.raises(ConfigurationError, match="inbox dlq groups lists them"):
        failure_group("fp-nothex")


def test_groups_count_and_order_the_largest_first() -> None:
    found = groups(
        [
            record("ops.apply: ValueError: card declined"),
            record("ops.apply: LookupError: order 1 not found"),
            record("ops.apply: LookupError: order 2 not found"),
        ]
    )
    assert [(g.fingerprint.exception_type, g.count) for g in found] == [
        ("LookupError", 2),
        ("ValueError", 1),
    ]
    assert found[0].refs == [
        "ops.apply: LookupError: order 1 not found",
        "ops.apply: LookupError: order 2 not found",
    ]
    assert found[0].sample.message_id == "ops.apply: LookupError: order 1 not found"


def inbox_command(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_inbox_dlq_groups_lists_them_and_replay_group_takes_one_group(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    lost = [
        dead_letter(rabbit, queue, ref=f"o{n}", error=f"ops.apply: LookupError: order {n} lost")
        for n in (1, 2)
    ]
    declined = dead_letter(rabbit, queue, ref="o3", error="ops.apply: ValueError: declined")
    on = ["--broker", rabbit.url, "--queue", queue]

    code, out, _ = inbox_command("dlq", "groups", *on)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"2 failure groups among 3 of 3 dead letters in {dead_letter_queue(queue)}"
    assert lines[1].startswith("fp-")
    assert " count=2 " in lines[1]
    assert lines[2] == "  reason=handler-failed handlers=ops.apply exception=LookupError"
    assert lines[3] == "  error=order <n> lost"
    assert lines[4].startswith(f"  sample: id={lost[0]} ")

    code, out, _ = inbox_command("dlq", "groups", *on, "--json")
    document = json.loads(out)
    assert document["present"] == 3
    group = document["groups"][0]["id"]
    assert document["groups"][1]["sample"]["message_id"] == declined
    assert rabbit.depth(dead_letter_queue(queue)) == 3  # reading took nothing

    code, out, _ = inbox_command("dlq", "replay", *on, "--group", group)
    assert code == 0
    assert "replayed 2 of 3" in out
    replayed = sorted(m.properties["message_id"] for m in rabbit.take_all(queue))
    assert replayed == sorted(lost)
    assert rabbit.depth(dead_letter_queue(queue)) == 1

    code, _, err = inbox_command("dlq", "replay", *on, "--group", "order-lost")
    assert code == 2
    assert "expected a failure group like fp-" in err
