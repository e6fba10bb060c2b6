"""Inbox tasks in Celery's eager mode (the path users' tests take, the same ``__call__`` the
worker calls): one commit per task id or key, the stored result returned to a redelivery,
retries rolled back with the claim, the result bound, the settings a worker refuses."""

from __future__ import annotations

import ast
import inspect
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from support.databases import Database, effects

import inbox as inbox_package
from inbox import Inbox
from inbox.celery import InboxTasks, ResultTooLarge, result_metadata, task_result_table
from inbox.errors import ConfigurationError, InvalidMessage


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("celery_tasks_test", set_as_current=False)
    app.conf.task_always_eager = True
    # Celery's own eager mode raises a retry's Retry out of delay() when set to propagate
    # (plain tasks too); EagerResult.get() raises a task's failure either way.
    app.conf.task_eager_propagates = False
    yield app
    app.close()


@pytest.fixture
def tasks(app: Celery, db: Database) -> InboxTasks:
    result_metadata.create_all(db.engine)
    return InboxTasks(app, Inbox(db.sessions), db.sessions)


def write(session: Session, ref: str, handler: str) -> None:
    session.execute(effects.insert().values(ref=ref, handler=handler))


def test_a_task_id_commits_once_and_its_redelivery_returns_the_first_value(
    tasks: InboxTasks, db: Database
) -> None:
    @tasks.task(name="t.record")
    def record(session: Session, ref: str) -> dict[str, str]:
        write(session, ref, "t.record")
        return {"ref": ref, "run": uuid.uuid4().hex}  # differs on every run of the body

    task_id = str(uuid.uuid4())
    first = record.apply_async(("a",), task_id=task_id).get()
    again = record.apply_async(("a",), task_id=task_id).get()
    other = record.apply_async(("a",)).get()
    assert again == first
    assert other != first
    assert db.effect_counts() == {("a", "t.record"): 2}
    assert db.count(task_result_table) == 2


def test_key_deduplicates_across_task_ids_and_none_is_stored_too(
    tasks: InboxTasks, db: Database
) -> None:
    @tasks.task(name="t.charge", key=lambda order, amount: f"charge-{order}")
    def charge(session: Session, order: int, amount: int) -> None:
        write(session, str(order), "t.charge")

    for _ in range(3):
        assert charge.delay(7, amount=10).get() is None
    charge.delay(8, 10).get()
    assert db.effect_counts() == {("7", "t.charge"): 1, ("8", "t.charge"): 1}
    assert db.count(task_result_table) == 2, "a None is stored: a missing row means lost"


def test_a_redelivery_whose_stored_value_is_gone_warns_instead_of_passing_none_silently(
    tasks: InboxTasks, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    @tasks.task(name="t.total")
    def total(session: Session, order: int) -> int:
        write(session, str(order), "t.total")
        return order * 10

    task_id = str(uuid.uuid4())
    assert total.apply_async((4,), task_id=task_id).get() == 40
    with caplog.at_level(logging.WARNING, logger="inbox.celery"):
        assert total.apply_async((4,), task_id=task_id).get() == 40
    assert caplog.records == [], "a stored value comes back without a word"

    with db.engine.begin() as connection:
        connection.execute(delete(task_result_table))
    with caplog.at_level(logging.WARNING, logger="inbox.celery"):
        assert total.apply_async((4,), task_id=task_id).get() is None
    assert db.effect_counts() == {("4", "t.total"): 1}, "the body did not run again"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert f"inbox task 't.total': claim {task_id} is taken" in message
    assert "stored return value is gone" in message


def test_a_retry_rolls_back_the_writes_and_the_claim_then_commits_once(
    tasks: InboxTasks, db: Database
) -> None:
    attempts: list[int] = []

    @tasks.task(name="t.flaky", bind=True, max_retries=3, default_retry_delay=0)
    def flaky(self: Any, session: Session, ref: str) -> str:
        write(session, ref, "t.flaky")
        attempts.append(self.request.retries)
        if len(attempts) < 3:
            raise self.retry()
        return "done"

    assert flaky.delay("r").get() == "done"
    assert attempts == [0, 1, 2]
    assert db.effect_counts() == {("r", "t.flaky"): 1}


def test_autoretry_for_and_the_last_failure_reach_celery_with_nothing_committed(
    tasks: InboxTasks, db: Database
) -> None:
    @tasks.task(name="t.broken", autoretry_for=(KeyError,), max_retries=2, retry_backoff=False)
    def broken(session: Session, ref: str) -> None:
        write(session, ref, "t.broken")
        raise KeyError(ref)

    with pytest.raises(KeyError):
        broken.apply_async(("x",), countdown=0).get()
    assert db.effect_counts() == {}


def test_a_result_past_the_limit_is_refused_and_rolled_back(
    tasks: InboxTasks, db: Database
) -> None:
    @tasks.task(name="t.big", max_result_bytes=100)
    def big(session: Session, ref: str) -> str:
        write(session, ref, "t.big")
        return "x" * 200

    with pytest.raises(ResultTooLarge, match=r"'t.big' returned 202 bytes .* max_result_bytes=100"):
        big.delay("b").get()
    assert db.effect_counts() == {}
    with db.engine.connect() as connection:
        assert connection.execute(select(task_result_table)).all() == []


def test_arguments_are_checked_without_the_session_and_a_task_needs_one(
    tasks: InboxTasks,
) -> None:
    @tasks.task(name="t.two")
    def two(session: Session, a: int, b: int) -> int:
        return a + b

    assert two.delay(1, 2).get() == 3
    with pytest.raises(TypeError):
        two.delay(1)
    with pytest.raises(ConfigurationError, match="session as its first argument"):
        tasks.task(name="t.none")(lambda: None)
    with pytest.raises(ConfigurationError, match="base= must be a subclass of InboxTask"):
        tasks.task(name="t.base", base=object)(two)


def test_a_call_binds_the_arguments_to_a_signature_built_once_per_task(
    tasks: InboxTasks, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    @tasks.task(name="t.plain")
    def plain(session: Session, a: int, b: int = 0) -> int:
        write(session, f"{a}+{b}", "t.plain")
        return a + b

    @tasks.task(name="t.bound", bind=True)
    def bound(self: Any, session: Session, a: int, b: int = 0) -> int:
        write(session, f"{a}+{b}", "t.bound")
        return a + b

    built: list[object] = []
    signature = inspect.signature

    def counted(obj: Any, **options: Any) -> inspect.Signature:
        built.append(obj)
        return signature(obj, **options)

    monkeypatch.setattr(inspect, "signature", counted)
    for task in (plain, bound):
        for _ in range(3):
            assert task.apply((1,), {"b": 2}).get() == 3
        # apply() skips Celery's own argument check: these reach the inbox task's, whose
        # InvalidBody comes back out of the EagerResult as its base class.
        call = f"not a valid call for handler '{task.name}': "
        with pytest.raises(InvalidMessage, match=call + "too many positional arguments"):
            task.apply((1, 2, 3)).get()
        with pytest.raises(InvalidMessage, match=call + "missing a required argument: 'a'"):
            task.apply((), {"b": 2}).get()
    assert built == [], "a call built a signature"
    assert db.effect_counts() == {("1+2", "t.plain"): 3, ("1+2", "t.bound"): 3}


def test_a_worker_refuses_settings_that_break_exactly_once(db: Database) -> None:
    app = Celery("refuse", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.worker_prefetch_multiplier = 4
    tasks = InboxTasks(app, Inbox(db.sessions), db.sessions)

    @tasks.task(name="t.early", acks_late=False, reject_on_worker_lost=False)
    def early(session: Session) -> None: ...

    @tasks.task(name="t.bounded", time_limit=60)
    def bounded(session: Session) -> None: ...

    problems = tasks.problems()
    assert len(problems) == 4, problems  # t.bounded (time_limit=60) is fine
    assert problems[0].startswith("inbox task 't.early': acks_late is off")
    assert "reject_on_worker_lost is off" in problems[1]
    assert "time_limit=None is not below the Redis visibility_timeout=3600 s" in problems[2]
    assert all("fix:" in line for line in problems)
    assert problems[3].startswith("worker_prefetch_multiplier=4")

    class Worker:
        pass

    worker = Worker()
    worker.app = app  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match=r"inbox\.celery refuses to start the worker: inbox task"):
        tasks._check_worker(sender=worker)
    app.close()


def test_import_inbox_imports_nothing_of_celery() -> None:
    code = (
        "import sys, inbox, inbox.outbox, inbox.broker; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'celery'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_effect_in_an_inbox_task_is_called_once_across_retries(
    app: Celery, pg_db: Database
) -> None:
    result_metadata.create_all(pg_db.engine)
    inbox = Inbox(pg_db.sessions)
    tasks = InboxTasks(app, inbox, pg_db.sessions)
    calls: list[uuid.UUID] = []

    @tasks.task(name="t.pay", bind=True, max_retries=2, default_retry_delay=0)
    def pay(self: Any, session: Session, ref: str) -> str:
        receipt = inbox.effect("charge", lambda key: calls.append(key) or f"paid-{ref}")
        write(session, ref, "t.pay")
        if self.request.retries < 2:
            raise self.retry()
        return str(receipt)

    assert pay.delay("p").get() == "paid-p"
    assert len(calls) == 1
    assert pg_db.effect_counts() == {("p", "t.pay"): 1}


def test_celery_is_imported_by_inbox_celery_alone() -> None:
    """The Celery edge is the one package that knows Celery (docs/architecture.md)."""
    root = Path(inbox_package.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "celery" and path.parent.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert all(name.split(".")[0] != "celery" for name in names), path
