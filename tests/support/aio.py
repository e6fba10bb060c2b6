"""Async test support: the async drivers, an async engine on a fresh test database, and
effect-writing async handlers.

Each test runs its coroutine with :func:`run` (``asyncio.run``: no pytest plugin needed) and
makes its engine inside it, because an asyncio connection pool belongs to one event loop.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Engine, QueuePool, insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import InboxError, Message, ProcessResult
from inbox.aio import AsyncInbox
from inbox.core._handlers import default_name
from support.databases import Database, effects, fresh_database

T = TypeVar("T")

ASYNC_DRIVERS: dict[str, tuple[str, str]] = {
    # id: (the backend of the fresh database, the async driver name)
    "aiosqlite": ("sqlite", "aiosqlite"),
    "psycopg-async": ("postgresql", "psycopg"),
    "asyncpg": ("postgresql", "asyncpg"),
    "asyncmy": ("mariadb", "asyncmy"),
}
"""Every async driver the suite runs on, by test id."""

SERVER_DRIVERS = ("psycopg-async", "asyncpg", "asyncmy")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh event loop."""
    return asyncio.run(main)


def async_url(blocking_url: str, driver: str) -> tuple[str, dict[str, Any]]:
    """The URL (and connect_args) of the test database at ``blocking_url`` for the async
    ``driver``."""
    url = make_url(blocking_url)
    connect_args: dict[str, Any] = {}
    if driver == "asyncpg":
        # asyncpg takes server settings as a keyword, not libpq's "options" parameter.
        options = str(url.query.get("options", ""))
        url = url.difference_update_query(["options"])
        if options.startswith("-csearch_path="):
            connect_args["server_settings"] = {"search_path": options.split("=", 1)[1]}
    backend = url.get_backend_name()
    url = url.set(drivername=f"{backend}+{driver}")
    return url.render_as_string(hide_password=False), connect_args


@asynccontextmanager
async def async_engine(db: Database, driver: str, **options: Any) -> AsyncIterator[AsyncEngine]:
    """An async engine on ``db`` through ``driver``, disposed on exit."""
    url, connect_args = async_url(db.url, driver)
    engine = _create_async_engine(url, connect_args=connect_args, **options)
    try:
        yield engine
    finally:
        await engine.dispose()


async def record_effect(message: Message, session: AsyncSession, handler: str) -> None:
    """The business effect every async test handler commits: one row in ``effects``."""
    ref = str(message.body["ref"]) if isinstance(message.body, dict) else str(message.id)
    await session.execute(insert(effects).values(ref=ref, handler=handler))


class AsyncRecorder:
    """Registers effect-writing async handlers on an AsyncInbox and counts their runs."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], **options: Any) -> None:
        self.inbox = AsyncInbox(sessions, **options)
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, int] = {}

    def add(
        self,
        name: str,
        message_type: str | None = None,
        *,
        key: Callable[[Message], object] | None = None,
    ) -> None:
        """A handler ``name`` that writes one effect, failing while ``self.fail[name] > 0``."""

        async def handler(message: Message, session: AsyncSession) -> None:
            self.calls[name] += 1
            await record_effect(message, session, name)
            if self.fail.get(name, 0) > 0:
                self.fail[name] -= 1
                raise RuntimeError(f"{name} failed on purpose")

        self.inbox.handler(message_type, name=name, key=key)(handler)  # type: ignore[arg-type]


@dataclass
class AsyncDatabase:
    """A fresh test database (see :func:`support.databases.fresh_database`) reached through
    an async driver; the blocking ``db`` is there for setting up and counting."""

    db: Database
    driver: str

    def engine(self, **options: Any) -> AbstractAsyncContextManager[AsyncEngine]:
        """An async engine on this database, disposed on exit."""
        return async_engine(self.db, self.driver, **options)


def fresh_async_database(
    driver_id: str, admin: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database for the async driver ``driver_id`` (a key of ASYNC_DRIVERS)."""
    backend, driver = ASYNC_DRIVERS[driver_id]
    for db in fresh_database(backend, admin, tmp_path):  # one, dropped when resumed
        yield AsyncDatabase(db, driver)


def checked_out(engine: AsyncEngine) -> int:
    """How many connections of ``engine``'s pool are checked out now."""
    pool = engine.sync_engine.pool
    assert isinstance(pool, QueuePool), f"expected a queue pool, got {type(pool).__name__}"
    return pool.checkedout()


class KeptSessions:
    """An async session factory that keeps every session it made, so that a test sees what
    the inbox left in them: garbage collection cannot quietly return a connection the inbox
    forgot to give back."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._maker = async_sessionmaker(engine)
        self.made: list[AsyncSession] = []

    def __call__(self) -> AsyncSession:
        session = self._maker()
        self.made.append(session)
        return session

    def left_open(self) -> list[AsyncSession]:
        """The sessions still in a transaction."""
        return [session for session in self.made if session.in_transaction()]


BLOCKING_TO_ASYNC = {"sqlite": "aiosqlite", "postgresql": "psycopg", "mysql": "asyncmy"}
"""The async driver that stands in for each backend's blocking driver in the shared suite."""


class AsyncInboxAsBlocking:
    """The blocking ``Inbox`` surface over an :class:`AsyncInbox`, so that the blocking
    suite's cases run unchanged through the async inbox.

    Made from the blocking ``sessionmaker`` a test passes to ``Inbox``: the same database,
    reached through an async driver on an event loop of its own. Blocking handlers are
    registered as async handlers that run them on the session's synchronous side
    (``AsyncSession.run_sync``), under the same name and key; the claim, the checks, the
    guards and the commit are the async inbox's. :meth:`close` disposes of the engine.
    """

    made: ClassVar[list[AsyncInboxAsBlocking]] = []

    def __init__(self, session_factory: sessionmaker[Session], **options: Any) -> None:
        bind = session_factory.kw["bind"]
        assert isinstance(bind, Engine), "the shared suite runs on Engine-bound sessionmakers"
        backend = bind.url.get_backend_name()
        url, connect_args = async_url(
            bind.url.render_as_string(hide_password=False), BLOCKING_TO_ASYNC[backend]
        )
        self._loop = asyncio.Runner()
        self._engine = _create_async_engine(url, connect_args=connect_args)
        self.made.append(self)
        self.inbox = AsyncInbox(async_sessionmaker(self._engine), **options)

    def handler(
        self, func_or_type: Any = None, /, *, name: str | None = None, key: Any = None
    ) -> Any:
        """``Inbox.handler``: bare, with a type, ``name=`` and ``key=``."""
        if callable(func_or_type) and not isinstance(func_or_type, str):
            return self._register(func_or_type, None, name, key)
        return lambda func: self._register(func, func_or_type, name, key)

    def _register(
        self,
        func: Callable[[Message, Session], object],
        message_type: str | None,
        name: str | None,
        key: Any,
    ) -> Any:
        async def on_sync_side(message: Message, session: AsyncSession) -> None:
            await session.run_sync(lambda sync_session: func(message, sync_session))

        handler_name = default_name(func) if name is None else name
        self.inbox.handler(message_type, name=handler_name, key=key)(on_sync_side)
        return func

    def process(self, message: Message) -> ProcessResult:
        """``await AsyncInbox.process(message)`` on this object's event loop."""
        return self._loop.run(self.inbox.process(message))

    def process_batch(self, messages: Any) -> list[ProcessResult | InboxError]:
        """``await AsyncInbox.process_batch(messages)`` on this object's event loop."""
        return self._loop.run(self.inbox.process_batch(messages))

    def close(self) -> None:
        """Dispose of the async engine and close the event loop."""
        self._loop.run(self._engine.dispose())
        self._loop.close()


# The blocking suite's backend-parametrized cases that run through both inboxes: conftest's
# inbox_flavour runs each of them as-is and again with its module's ``Inbox`` replaced by
# AsyncInboxAsBlocking. Cases about blocking-only set-ups (a Connection-bound or scoped
# session, a pysqlite recipe, threads) are not listed.
SHARED_CASES: dict[str, tuple[str, ...]] = {
    "test_process": (
        "test_first_delivery_runs_handler_and_commits_claim_with_effect",
        "test_duplicate_delivery_skips_handler_and_commits_nothing",
        "test_failing_handler_leaves_no_claim_and_no_effect_then_retry_succeeds_once",
        "test_fan_out_failure_of_one_handler_reruns_only_that_handler",
        "test_business_key_dedups_two_different_message_ids",
        "test_business_key_as_uuid_or_16_bytes_is_stored_as_is",
        "test_header_idempotency_key_dedups_a_producer_retry_with_a_fresh_id",
        "test_handler_key_takes_precedence_over_the_header",
        "test_same_message_id_under_two_handler_names_runs_both",
        "test_bad_key_function_raises_invalid_key_and_runs_nothing",
        "test_unhandled_type_raises_by_default_and_is_ignored_when_configured",
        "test_catch_all_handler_takes_every_type_and_typed_handler_only_its_own",
        "test_handler_that_ends_the_transaction_gets_a_clear_error_and_nothing_commits",
        "test_handler_may_use_a_savepoint",
        "test_decisions_are_logged_on_the_inbox_logger",
        "test_effects_written_through_the_orm_commit_with_the_claim",
        "test_handler_names_differing_in_case_or_accents_are_distinct_claims",
        "test_a_violation_of_another_unique_constraint_is_an_error_not_a_duplicate",
        "test_a_swallowed_database_error_never_reports_uncommitted_work_as_processed",
        "test_a_handler_committing_behind_the_guards_is_refused_and_nothing_commits",
    ),
    "test_batch": (
        "test_a_mixed_batch_gives_one_result_per_message_in_order_and_each_effect_once",
        "test_an_unhandled_type_in_a_batch_is_reported_at_its_place_and_the_rest_commits",
        "test_handlers_run_in_message_order_and_per_message_in_registration_order",
        "test_a_poison_message_at_any_position_fails_alone_and_every_other_commits_once",
        "test_several_poison_messages_fail_alone_and_every_other_commits_once",
        "test_a_failing_message_delivered_twice_in_one_batch_fails_for_both_copies",
        "test_a_batch_larger_than_one_claim_statement_page_claims_every_key_once",
        "test_a_handler_ending_the_transaction_in_a_batch_fails_for_its_message_only",
        "test_a_handler_committing_behind_the_guards_in_a_batch_loses_no_other_message",
    ),
}
