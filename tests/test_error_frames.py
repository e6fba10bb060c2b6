"""The first application frame of a failure (issue 34 item 1): a real worker on RabbitMQ and
PostgreSQL records it in a dead letter's ``x-inbox-error-frame`` header, and the failure
groups tell the same exception raised from two lines apart by it."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from sqlalchemy.orm import Session
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import run_until_idle

from inbox import Inbox, Message
from inbox.admin import admin_main
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.delivery import headers as h
from inbox.delivery._frames import MAX_FRAME_CHARS, application_frame, error_frames
from inbox.delivery._policy import DeadLetter, decide
from inbox.errors import HandlerFailed, InvalidMessage
from inbox.operations._dead_letters import DeadLetterRecord
from inbox.operations._failure_groups import fingerprint_of
from inbox.result import ProcessResult

ONCE = RetryPolicy((), max_tries=1)


def raised_from_here() -> BaseException:
    try:
        json.loads("not json")  # raised in the standard library, called from this line
    except ValueError as exc:
        return exc
    raise AssertionError("json.loads accepted it")


def test_the_frame_is_the_innermost_application_frame_past_the_standard_library() -> None:
    exc = raised_from_here()
    line = raised_from_here.__code__.co_firstlineno + 2
    assert application_frame(exc) == f"{__name__}:raised_from_here:{line}"
    assert application_frame(ValueError("never raised")) is None  # no traceback at all


def test_frames_in_the_inbox_package_are_not_the_application() -> None:
    with pytest.raises(InvalidMessage) as raised:
        Message(id="not-an-id", type="op", body={})  # raised inside inbox/message.py
    exc = raised.value
    assert application_frame(exc) == (
        f"{__name__}:test_frames_in_the_inbox_package_are_not_the_application:"
        f"{test_frames_in_the_inbox_package_are_not_the_application.__code__.co_firstlineno + 2}"
    )
    assert exc.__traceback__ is not None
    exc.__traceback__ = exc.__traceback__.tb_next  # only the inbox's own frames are left
    assert exc.__traceback__ is not None
    assert application_frame(exc) is None


def test_the_header_names_each_failed_handler_and_is_bounded() -> None:
    exc = raised_from_here()
    value = error_frames({"a": exc, "b": ValueError("no traceback"), "c": exc})
    assert value is not None
    frame = application_frame(exc)
    assert value == f"a@{frame}; c@{frame}"
    assert error_frames({"b": ValueError("no traceback")}) is None
    many = error_frames({f"handler-{n:03}": exc for n in range(50)})
    assert many is not None
    assert len(many) == MAX_FRAME_CHARS
    assert many.endswith("…")


def test_only_a_dead_letter_carries_the_frame() -> None:
    exc = raised_from_here()
    message = Message.new("op", {})
    assert isinstance(exc, Exception)
    failed = HandlerFailed(message.id, {"ops.apply": exc}, ProcessResult(message.id, {}))
    retry = decide(failed, 0, RetryPolicy((0.1,), max_tries=2))
    assert not isinstance(retry, DeadLetter)
    dead = decide(failed, 1, RetryPolicy((0.1,), max_tries=2))
    assert isinstance(dead, DeadLetter)
    assert dead.frame == f"ops.apply@{application_frame(exc)}"


def fail_at_a(ref: str) -> None:
    raise LookupError(f"order {ref} not found")


def fail_at_b(ref: str) -> None:
    raise LookupError(f"order {ref} not found")


def make_inbox(db: Database) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        if message.body["where"] == "a":
            fail_at_a(message.body["ref"])
        fail_at_b(message.body["ref"])

    return inbox


def test_the_same_exception_from_two_lines_is_two_groups_and_from_one_line_one(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=ONCE)
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for ref, where in (("1", "a"), ("2", "a"), ("3", "b")):
            publisher.publish("op", {"ref": ref, "where": where})
    run_until_idle(worker, 1.0)

    out, err = io.StringIO(), io.StringIO()
    argv = ["dlq", "groups", "--broker", rabbit.url, "--queue", queue, "--json"]
    code = admin_main(argv, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    found = json.loads(out.getvalue())["groups"]
    assert sorted(g["count"] for g in found) == [1, 2]
    by_count = {g["count"]: g for g in found}
    assert "fail_at_a" in json.dumps(by_count[2])
    assert "fail_at_b" in json.dumps(by_count[1])

    taken = rabbit.take_all(f"{queue}.dlq")
    letters = [
        DeadLetterRecord.of(m.properties, m.properties["application_headers"], m.body)
        for m in taken
    ]
    assert len(letters) == 3
    assert {letter.error_frame for letter in letters} == {
        f"ops.apply@{__name__}:fail_at_a:{fail_at_a.__code__.co_firstlineno + 1}",
        f"ops.apply@{__name__}:fail_at_b:{fail_at_b.__code__.co_firstlineno + 1}",
    }
    # The error text is the same for all three once normalised: only the frame tells a from b.
    assert len({fingerprint_of(letter).message for letter in letters}) == 1


def test_a_letter_without_the_frame_keeps_the_group_it_had() -> None:
    headers = {
        h.ERROR: "ops.apply: LookupError: order 7 not found",
        h.FAILED_HANDLERS: "ops.apply",
        h.REASON: "handler-failed",
    }
    old = fingerprint_of(DeadLetterRecord.of({"message_id": "m"}, headers, b"{}"))
    # The id from before frames were recorded (reason, handlers, type, text joined by NULs).
    before = "handler-failed\0ops.apply\0LookupError\0order <n> not found"
    assert old.id == "fp-" + hashlib.sha256(before.encode()).hexdigest()[:12]
    framed = {**headers, h.ERROR_FRAME: "ops.apply@app:apply:3"}
    assert fingerprint_of(DeadLetterRecord.of({"message_id": "m"}, framed, b"{}")).id != old.id
