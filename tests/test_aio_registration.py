"""AsyncInbox registration and construction: the decorator forms of Inbox, async handlers
only, and the session factories and engines it cannot use, refused before any message."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.dialects.mysql.aiomysql import MySQLDialect_aiomysql
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from support.aio import run

from inbox import (
    Inbox,
    Message,
    Outcome,
    RegistrationError,
    SessionConfigurationError,
    UnsupportedDialect,
)
from inbox._backends import check_supported
from inbox.aio import AsyncInbox
from inbox.schema import metadata


async def module_level(message: Message, session: AsyncSession) -> None:
    """An async handler with a stable default name."""


def blocking(message: Message, session: Session) -> None:
    """A plain function: the async inbox cannot await it."""


async def async_generator(message: Message, session: AsyncSession) -> Any:
    yield None


class AsyncCallable:
    async def __call__(self, message: Message, session: AsyncSession) -> None:
        """An instance whose call returns a coroutine."""


@pytest.fixture
def inbox(tmp_path: Path) -> AsyncInbox:
    return AsyncInbox(async_sessionmaker(create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x")))


def test_the_decorator_forms_of_inbox_register_async_handlers_unchanged(
    inbox: AsyncInbox,
) -> None:
    def key(message: Message) -> str:
        return "k"

    assert inbox.handler(module_level) is module_level
    called = inbox.handler("order.created", name="billing.invoice", key=key)(module_level)
    assert called is module_level
    instance = AsyncCallable()
    inbox.handler("user.deleted", name="callable")(instance)
    inbox.handler(functools.partial(module_level), name="partial")  # type: ignore[call-overload]
    assert [(h.name, h.message_type, h.key) for h in inbox.handlers] == [
        (f"{__name__}.module_level", None, None),
        ("billing.invoice", "order.created", key),
        ("callable", "user.deleted", None),
        ("partial", None, None),
    ]
    with pytest.raises(RegistrationError, match="already registered"):
        inbox.handler("other")(module_level)


@pytest.mark.parametrize(
    "func",
    [blocking, async_generator, functools.partial(blocking), lambda m, s: None],
    ids=["def", "async generator", "partial of def", "lambda"],
)
def test_a_handler_that_is_not_a_coroutine_function_is_refused_at_registration(
    inbox: AsyncInbox, func: Any
) -> None:
    with pytest.raises(RegistrationError, match="not a coroutine function"):
        inbox.handler("t", name="blocking")(func)
    assert inbox.handlers == ()


def test_a_coroutine_key_function_is_refused_at_registration(inbox: AsyncInbox) -> None:
    async def key(message: Message) -> str:
        return "k"

    with pytest.raises(RegistrationError, match="key function"):
        inbox.handler("t", key=key)(module_level)  # type: ignore[arg-type]
    assert inbox.handlers == ()


def test_bad_options_are_refused_as_for_inbox(tmp_path: Path) -> None:
    sessions = async_sessionmaker(create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x"))
    with pytest.raises(TypeError, match="async_sessionmaker"):
        AsyncInbox("not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transient_retries must be >= 0"):
        AsyncInbox(sessions, transient_retries=-1)
    with pytest.raises(ValueError, match="'sometimes'"):
        AsyncInbox(sessions, on_unhandled="sometimes")
    with pytest.raises(RegistrationError, match="non-empty str"):
        AsyncInbox(sessions).handler("")


def test_blocking_and_async_session_factories_are_each_refused_by_the_other_inbox(
    tmp_path: Path,
) -> None:
    blocking_engine = create_engine(f"sqlite:///{tmp_path}/x")
    async_engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/x")
    with pytest.raises(SessionConfigurationError, match="blocking Session"):
        AsyncInbox(sessionmaker(blocking_engine))  # type: ignore[arg-type]
    with pytest.raises(SessionConfigurationError, match="asyncio engine"):
        Inbox(sessionmaker(async_engine.sync_engine))
    mixed_up = Inbox(async_sessionmaker(async_engine))  # type: ignore[arg-type]
    mixed_up.handler(blocking)
    with pytest.raises(SessionConfigurationError, match=r"must return a sqlalchemy\.orm\.Session"):
        mixed_up.process(Message.new("t", {}))


def test_aiomysql_is_refused_for_its_bytes_parameter_bug() -> None:
    """aiomysql 0.3.2 with PyMySQL >= 1.2.3 breaks bytes parameters (aio-libs/aiomysql#1080;
    with PyMySQL 1.2.4, ``cursor.execute("SELECT %s", (b"...",))`` raises TypeError while a
    str parameter works): every claim would fail, so the driver is refused, naming asyncmy."""
    with pytest.raises(UnsupportedDialect, match=r"mysql\+asyncmy"):
        check_supported(MySQLDialect_aiomysql())


def test_sessions_the_inbox_cannot_own_are_refused_before_writing(tmp_path: Path) -> None:
    async def main() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/inbox.db")
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        busy = AsyncSession(engine)
        await busy.begin()
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        try:
            with pytest.raises(SessionConfigurationError, match="already in a transaction"):
                AsyncInbox(lambda: busy)
            async with engine.connect() as outer:
                await outer.begin()
                with pytest.raises(SessionConfigurationError, match="bound to a Connection"):
                    AsyncInbox(async_sessionmaker(outer))
            inbox = AsyncInbox(async_sessionmaker(autocommit))
            calls: list[str] = []

            @inbox.handler(name="never")
            async def never(message: Message, session: AsyncSession) -> None:
                calls.append("ran")

            with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
                await inbox.process(Message.new("t", {}))
            assert calls == []
            assert busy.in_transaction()
            ok = AsyncInbox(async_sessionmaker(engine))
            ok.handler(name="fine")(module_level)
            assert (await ok.process(Message.new("t", {}))).outcome is Outcome.PROCESSED
        finally:
            await busy.close()
            await engine.dispose()

    run(main())
