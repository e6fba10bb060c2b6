"""AsyncInbox on every async driver (aiosqlite, psycopg async, asyncpg, asyncmy on MariaDB):
the dedup cases of the blocking suite, the guards, batches, and 50 concurrent tasks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import (
    ASYNC_DRIVERS,
    SERVER_DRIVERS,
    AsyncDatabase,
    AsyncRecorder,
    async_url,
    checked_out,
    fresh_async_database,
    record_effect,
    run,
)
from support.effects import order

import inbox as inbox_package
from inbox import (
    HandlerFailed,
    HandlerInterrupted,
    InvalidKey,
    Message,
    Outcome,
    ProcessResult,
    TransactionControlError,
    UnhandledMessage,
)
from inbox.aio import AsyncInbox
from inbox.message import KEY_NAMESPACE
from inbox.schema import inbox_message


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


@pytest.fixture(params=SERVER_DRIVERS)
def server_adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database on the real servers, through their async drivers."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


def claims(adb: AsyncDatabase) -> list[tuple[uuid.UUID, str]]:
    with adb.db.engine.connect() as connection:
        rows = connection.execute(select(inbox_message.c.message_id, inbox_message.c.handler))
        return [(m, h) for m, h in rows]


def test_first_delivery_processes_and_redeliveries_are_duplicates(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("billing.charge", "order.created")
            message = order(1)

            first = await recorder.inbox.process(message)
            again = await recorder.inbox.process(message)
            upper = Message(id=str(message.id).upper(), type="order.created", body={"ref": 1})
            third = await recorder.inbox.process(upper)

            assert first.outcomes == {"billing.charge": Outcome.PROCESSED}
            assert again.outcome is third.outcome is Outcome.DUPLICATE
            assert recorder.calls["billing.charge"] == 1
            assert checked_out(engine) == 0
        assert adb.db.effect_counts() == {("1", "billing.charge"): 1}
        assert claims(adb) == [(message.id, "billing.charge")]

    run(main())


def test_a_failing_handler_leaves_no_claim_and_its_retry_commits_once(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("billing.charge")
            recorder.fail["billing.charge"] = 1
            message = order(7)

            with pytest.raises(HandlerFailed) as failed:
                await recorder.inbox.process(message)
            assert set(failed.value.failures) == {"billing.charge"}
            assert isinstance(failed.value.__cause__, RuntimeError)
            assert claims(adb) == []
            assert adb.db.effect_counts() == {}
            assert checked_out(engine) == 0

            assert (await recorder.inbox.process(message)).outcome is Outcome.PROCESSED
            assert (await recorder.inbox.process(message)).outcome is Outcome.DUPLICATE
        assert recorder.calls["billing.charge"] == 2
        assert adb.db.effect_counts() == {("7", "billing.charge"): 1}

    run(main())


def test_fan_out_failure_of_one_handler_reruns_only_that_handler(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            for name in ("a.first", "b.second", "c.third"):
                recorder.add(name, "order.created")
            recorder.fail["b.second"] = 1
            message = order(3)

            with pytest.raises(HandlerFailed) as failed:
                await recorder.inbox.process(message)
            error = failed.value
            assert list(error.failures) == ["b.second"]
            assert error.__cause__ is error.failures["b.second"]
            assert error.result.outcomes == {
                "a.first": Outcome.PROCESSED,
                "c.third": Outcome.PROCESSED,
            }

            redelivered = await recorder.inbox.process(message)
            assert redelivered.outcomes == {
                "a.first": Outcome.DUPLICATE,
                "b.second": Outcome.PROCESSED,
                "c.third": Outcome.DUPLICATE,
            }
        assert recorder.calls == {"a.first": 1, "b.second": 2, "c.third": 1}
        assert adb.db.effect_counts() == {("3", n): 1 for n in ("a.first", "b.second", "c.third")}

    run(main())


def test_business_keys_and_the_idempotency_header_dedup_fresh_ids(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("billing.invoice", "order.created", key=lambda m: f"inv-{m.body['ref']}")
            recorder.add("shipping.label", "order.created")
            first, resent = order(42), order(42)
            keyed = order(43, **{"idempotency-key": "order-43"})
            keyed_again = order(43, **{"idempotency-key": "order-43"})

            assert (await recorder.inbox.process(first)).processed == (
                "billing.invoice",
                "shipping.label",
            )
            assert (await recorder.inbox.process(resent)).outcomes == {
                "billing.invoice": Outcome.DUPLICATE,  # same business key
                "shipping.label": Outcome.PROCESSED,  # keyed by the fresh id
            }
            assert (await recorder.inbox.process(keyed)).outcome is Outcome.PROCESSED
            assert (await recorder.inbox.process(keyed_again)).outcome is Outcome.DUPLICATE
        stored = {key for key, handler in claims(adb) if handler == "billing.invoice"}
        assert uuid.uuid5(KEY_NAMESPACE, "inv-42") in stored
        assert uuid.uuid5(KEY_NAMESPACE, "inv-43") in stored
        assert (uuid.uuid5(KEY_NAMESPACE, "order-43"), "shipping.label") in claims(adb)

    run(main())


def test_a_bad_key_or_an_unhandled_type_runs_nothing(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            sessions = async_sessionmaker(engine)
            recorder = AsyncRecorder(sessions)
            recorder.add("fine", "order.created")
            recorder.add("bad.key", "order.created", key=lambda m: "")
            with pytest.raises(InvalidKey, match=r"bad\.key"):
                await recorder.inbox.process(order(1))
            with pytest.raises(UnhandledMessage):
                await recorder.inbox.process(order(1, "user.deleted"))
            ignoring = AsyncRecorder(sessions, on_unhandled="ignore")
            ignoring.add("fine", "order.created")
            ignored = await ignoring.inbox.process(order(2, "user.deleted"))
            assert ignored.outcomes == {}
            assert recorder.calls == ignoring.calls == {}
        assert claims(adb) == []

    run(main())


@pytest.mark.parametrize("method", ["commit", "rollback", "close", "reset"])
def test_a_handler_ending_the_transaction_gets_a_clear_error_and_nothing_commits(
    adb: AsyncDatabase, method: str
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="rogue")
            async def rogue(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "rogue")
                await getattr(session, method)()

            with pytest.raises(HandlerFailed) as failed:
                await inbox.process(order(1))
            error = failed.value.failures["rogue"]
            assert isinstance(error, TransactionControlError)
            assert f"session.{method}()" in str(error)
            assert checked_out(engine) == 0
        assert claims(adb) == []
        assert adb.db.effect_counts() == {}

    run(main())


@pytest.mark.parametrize("how", ["session transaction", "connection"])
def test_a_handler_committing_behind_the_guards_is_refused_and_nothing_commits(
    adb: AsyncDatabase, how: str
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="sneaky")
            async def sneaky(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "sneaky")
                if how == "connection":
                    await (await session.connection()).commit()
                    return
                transaction = session.get_transaction()
                assert transaction is not None
                await transaction.commit()

            with pytest.raises(HandlerFailed) as failed:
                await inbox.process(order(1))
            error = failed.value.failures["sneaky"]
            assert isinstance(error, TransactionControlError)
            assert "ended the inbox's transaction" in str(error)
        assert claims(adb) == []
        assert adb.db.effect_counts() == {}

    run(main())


def test_a_handler_may_use_a_savepoint(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="careful")
            async def careful(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "kept")
                with contextlib.suppress(LookupError):
                    async with session.begin_nested():
                        await record_effect(message, session, "undone")
                        raise LookupError("optional part failed")

            assert (await inbox.process(order(1))).outcome is Outcome.PROCESSED
        assert adb.db.effect_counts() == {("1", "kept"): 1}

    run(main())


def test_a_swallowed_database_error_never_reports_uncommitted_work_as_processed(
    adb: AsyncDatabase,
) -> None:
    """On PostgreSQL the failed statement aborted the transaction: a failure is reported
    (psycopg: by the transaction-status check; asyncpg: the claim check's SELECT is refused
    in the aborted transaction) and nothing commits. Elsewhere only the statement is undone
    and the rest commits. Either way the reported outcome matches the database."""

    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            swallow = [True]

            @inbox.handler("order.created", name="sloppy")
            async def sloppy(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "sloppy")
                if swallow[0]:
                    with contextlib.suppress(DBAPIError):
                        await session.execute(
                            text("INSERT INTO effects (id, ref, handler) VALUES (NULL, NULL, NULL)")
                        )

            message = order(1)
            if adb.db.backend == "postgresql":
                with pytest.raises(HandlerFailed) as failed:
                    await inbox.process(message)
                error = failed.value.failures["sloppy"]
                assert isinstance(error, TransactionControlError | DBAPIError)
                assert claims(adb) == []
                assert adb.db.effect_counts() == {}
                swallow[0] = False
            assert (await inbox.process(message)).outcome is Outcome.PROCESSED
            assert checked_out(engine) == 0
        assert len(claims(adb)) == 1
        assert adb.db.effect_counts() == {("1", "sloppy"): 1}

    run(main())


def test_a_batch_gives_one_result_per_message_in_order_and_each_effect_once(
    adb: AsyncDatabase,
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("billing.charge", "order.created")
            recorder.add("audit", "order.created")
            done_before = order(0)
            await recorder.inbox.process(done_before)
            poison, first = order("poison"), order(1)

            async def fails_on_poison(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "picky")
                if message.body["ref"] == "poison":
                    raise ValueError("poison")

            recorder.inbox.handler("order.created", name="picky")(fails_on_poison)
            batch = [first, done_before, order(2), poison, first, order(3, "user.deleted")]

            results = await recorder.inbox.process_batch(batch)

            assert len(results) == len(batch)
            assert isinstance(results[0], ProcessResult)
            assert results[0].processed == ("billing.charge", "audit", "picky")
            assert isinstance(results[1], ProcessResult)
            assert results[1].outcomes == {
                "billing.charge": Outcome.DUPLICATE,
                "audit": Outcome.DUPLICATE,
                "picky": Outcome.PROCESSED,  # registered after done_before was processed
            }
            assert isinstance(results[2], ProcessResult)
            assert isinstance(results[3], HandlerFailed)
            assert list(results[3].failures) == ["picky"]
            assert isinstance(results[4], ProcessResult)
            assert results[4].outcome is Outcome.DUPLICATE  # the same message twice
            assert isinstance(results[5], UnhandledMessage)
            assert checked_out(engine) == 0
        counts = adb.db.effect_counts()
        assert counts[("poison", "billing.charge")] == 1  # its other handlers committed
        assert ("poison", "picky") not in counts
        assert all(n == 1 for n in counts.values())
        assert counts[("1", "picky")] == counts[("2", "picky")] == 1

    run(main())


def test_process_batch_refuses_anything_but_a_sequence_of_messages(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            with pytest.raises(TypeError, match=r"sequence of inbox\.Message"):
                await inbox.process_batch(order(1))  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"process\(\) takes an inbox\.Message"):
                await inbox.process("not a message")  # type: ignore[arg-type]

    run(main())


@pytest.mark.slow
def test_fifty_tasks_delivering_the_same_200_messages_commit_each_effect_once(
    server_adb: AsyncDatabase,
) -> None:
    messages = [order(n) for n in range(200)]

    async def deliver(inbox: AsyncInbox, seed: int) -> list[Outcome]:
        mine = list(messages)
        random.Random(seed).shuffle(mine)
        return [(await inbox.process(message)).outcome for message in mine]

    async def main() -> None:
        async with server_adb.engine(pool_size=20, max_overflow=30) as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("billing.charge")
            outcomes = await asyncio.gather(*(deliver(recorder.inbox, n) for n in range(50)))
            assert checked_out(engine) == 0
        flat = [outcome for per_task in outcomes for outcome in per_task]
        assert flat.count(Outcome.PROCESSED) == 200
        assert flat.count(Outcome.DUPLICATE) == 200 * 49
        assert recorder.calls["billing.charge"] == 200

    run(main())
    assert server_adb.db.effect_counts() == {(str(n), "billing.charge"): 1 for n in range(200)}
    assert len(claims(server_adb)) == 200


@pytest.mark.slow
def test_four_processes_of_tasks_delivering_the_same_200_messages_commit_each_once(
    server_adb: AsyncDatabase,
) -> None:
    processes, tasks = 4, 5
    ids = [str(order(n).id) for n in range(200)]
    script = Path(__file__).with_name("aio_concurrent_worker.py")
    # The processes import the inbox under test (this checkout) and the tests' helpers.
    package_root = Path(inbox_package.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root), str(script.parent)])}
    url, connect_args = async_url(server_adb.db.url, server_adb.driver)
    start_at = time.time() + 3.0
    args = [url, json.dumps(connect_args), str(start_at), str(tasks), *ids]
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(processes)
    ]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err
        reports.append(json.loads(out))

    assert [r["errors"] for r in reports] == [[]] * processes
    processed = sum(r["outcomes"].get("processed", 0) for r in reports)
    duplicates = sum(r["outcomes"].get("duplicate", 0) for r in reports)
    assert (processed, duplicates) == (200, 200 * (processes * tasks - 1))
    assert server_adb.db.effect_counts() == {(i, "billing.charge"): 1 for i in ids}


class Halt(BaseException):
    """A BaseException that is neither a cancellation nor an interpreter exit."""


def test_another_base_exception_from_a_handler_is_a_handler_failure_as_for_inbox(
    adb: AsyncDatabase,
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="halted")
            async def halted(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "halted")
                raise Halt

            @inbox.handler("order.created", name="fine")
            async def fine(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "fine")

            with pytest.raises(HandlerFailed) as failed:
                await inbox.process(order(1))
            error = failed.value.failures["halted"]
            assert isinstance(error, HandlerInterrupted)
            assert isinstance(error.__cause__, Halt)
            assert failed.value.result.outcomes == {"fine": Outcome.PROCESSED}
            assert checked_out(engine) == 0
        assert adb.db.effect_counts() == {("1", "fine"): 1}

    run(main())
