"""Running ``assert_idempotent``'s steps: against a blocking :class:`~inbox.Inbox` and its
engines, or awaited against an :class:`~inbox.aio.AsyncInbox` and its async engines (the
database work then runs on the blocking side of an async connection, ``run_sync``)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from inbox.core import Inbox
from inbox.errors import ConfigurationError
from inbox.message import Message
from inbox.testing._scenarios import Deliver, OnDatabase, SimulatedCrash, raising_after

if TYPE_CHECKING:  # the async extra may be missing: imported when an async inbox is given
    from sqlalchemy.ext.asyncio import AsyncEngine

    from inbox.aio import AsyncInbox

__all__ = ["async_engines_of", "drive", "drive_async", "engines_of"]

Flow = Generator[Deliver | OnDatabase, Any, None]


def drive(inbox: Inbox, message: Message, engines: list[Engine], flow: Flow) -> None:
    """Run ``flow`` to its end: each step's outcome is sent back, or what it raised thrown
    in (an assertion the flow raises comes out here)."""
    __tracebackhide__ = True
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            step = flow.send(sent) if thrown is None else flow.throw(thrown)
        except StopIteration:
            return
        sent, thrown = None, None
        try:
            if isinstance(step, OnDatabase):
                with engines[step.index].begin() as connection:
                    sent = step.work(connection)
            else:
                with raising_after(inbox, step):
                    sent = inbox.process(message)
        except (Exception, SimulatedCrash) as exc:
            thrown = exc


async def drive_async(
    inbox: AsyncInbox, message: Message, engines: list[AsyncEngine], flow: Flow
) -> None:
    """:func:`drive`, awaiting the async inbox and connections."""
    __tracebackhide__ = True
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            step = flow.send(sent) if thrown is None else flow.throw(thrown)
        except StopIteration:
            return
        sent, thrown = None, None
        try:
            if isinstance(step, OnDatabase):
                async with engines[step.index].begin() as connection:
                    sent = await connection.run_sync(step.work)
            else:
                with raising_after(inbox, step):
                    sent = await inbox.process(message)
        except (Exception, SimulatedCrash) as exc:
            thrown = exc


def engines_of(inbox: Inbox) -> list[Engine]:
    """The inbox's database, then its effect store when that is a database of its own."""
    session = _factory_of(inbox)()
    try:
        bind = session.get_bind(clause=inbox._claims.bind_clause)
    finally:
        session.close()
    engine = bind if isinstance(bind, Engine) else bind.engine
    store = getattr(getattr(inbox, "_effects", None), "_store", None)
    return [engine, store] if isinstance(store, Engine) and store.url != engine.url else [engine]


async def async_engines_of(inbox: AsyncInbox) -> list[AsyncEngine]:
    """:func:`engines_of` for an async inbox."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    session = _factory_of(inbox)()
    try:
        bind = session.sync_session.get_bind(clause=inbox._claims.bind_clause)
    finally:
        await session.close()
    engine = AsyncEngine(bind if isinstance(bind, Engine) else bind.engine)
    store = getattr(getattr(inbox, "_effects", None), "_store", None)
    if isinstance(store, AsyncEngine) and store.url != engine.url:
        return [engine, store]
    return [engine]


def _factory_of(inbox: Inbox | AsyncInbox) -> Callable[[], Any]:
    if inbox._session_factory is None:
        raise ConfigurationError(
            "assert_idempotent needs an inbox made with a session_factory; one made with "
            "sessions_for= (tenants) has no one database to snapshot: test it with an inbox "
            "for one tenant's sessionmaker"
        )
    return inbox._session_factory
