"""@inbox.handler: bare and called forms, stable names, and registration errors."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database

from inbox import HandlerFailed, Inbox, Message, Outcome, RegistrationError, Unhandled
from inbox.schema import HANDLER_NAME_MAX_LENGTH, inbox_message, metadata


def module_level(message: Message, session: Session) -> None:
    """A handler with a stable default name."""


class Handlers:
    def method(self, message: Message, session: Session) -> None:
        """A bound method: its qualname is stable."""


class CallableHandler:
    def __call__(self, message: Message, session: Session) -> None:
        """An instance: it has no qualname of its own."""


@pytest.fixture
def inbox() -> Inbox:
    return Inbox(sessionmaker(create_engine("sqlite://")))


def test_bare_decorator_registers_a_catch_all_and_returns_the_function(inbox: Inbox) -> None:
    returned = inbox.handler(module_level)
    assert returned is module_level
    [registered] = inbox.handlers
    assert registered.name == f"{__name__}.module_level"
    assert registered.message_type is None


def test_called_decorator_pins_type_name_and_key(inbox: Inbox) -> None:
    def key(message: Message) -> str:
        return "k"

    returned = inbox.handler("order.created", name="billing.invoice", key=key)(module_level)
    assert returned is module_level
    [registered] = inbox.handlers
    assert (registered.name, registered.message_type, registered.key) == (
        "billing.invoice",
        "order.created",
        key,
    )


def test_bound_methods_get_their_qualified_name(inbox: Inbox) -> None:
    inbox.handler("t")(Handlers().method)
    assert inbox.handlers[0].name == f"{__name__}.Handlers.method"


def test_registering_one_name_twice_is_an_error(inbox: Inbox) -> None:
    inbox.handler("a")(module_level)
    with pytest.raises(RegistrationError, match="already registered"):
        inbox.handler("b")(module_level)
    inbox.handler("b", name="other")(module_level)  # pinned names are independent
    with pytest.raises(RegistrationError, match="'other' is already registered"):
        inbox.handler("c", name="other")(Handlers().method)


@pytest.mark.parametrize(
    ("func", "fragment"),
    [
        (lambda m, s: None, "lambda"),
        (functools.partial(module_level), "partial"),
        (CallableHandler(), "no stable name"),
    ],
    ids=["lambda", "partial", "callable-object"],
)
def test_unstable_default_names_must_be_pinned(inbox: Inbox, func: Any, fragment: str) -> None:
    with pytest.raises(RegistrationError, match=fragment):
        inbox.handler("t")(func)
    inbox.handler("t", name="pinned")(func)
    assert inbox.handlers[0].name == "pinned"


def test_nested_functions_must_be_pinned(inbox: Inbox) -> None:
    def nested(message: Message, session: Session) -> None:
        pass

    with pytest.raises(RegistrationError, match="inside a function"):
        inbox.handler(nested)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("x" * (HANDLER_NAME_MAX_LENGTH + 1), "at most 255"),
        ("a\x00b", "NUL"),
        (42, "must be a str"),
    ],
)
def test_bad_names_are_rejected(inbox: Inbox, name: Any, fragment: str) -> None:
    with pytest.raises(RegistrationError, match=fragment):
        inbox.handler("t", name=name)(module_level)


def test_a_name_at_the_column_limit_is_accepted(db: Database) -> None:
    """Accepted at registration, and the claim row holds the whole name on every backend."""
    inbox = Inbox(db.sessions)
    name = "x" * HANDLER_NAME_MAX_LENGTH
    inbox.handler("t", name=name)(module_level)
    assert [h.name for h in inbox.handlers] == [name]
    result = inbox.process(Message.new("t", {}))
    assert result.outcomes == {name: Outcome.PROCESSED}
    with db.engine.connect() as connection:
        assert connection.execute(select(inbox_message.c.handler)).scalars().all() == [name]


@pytest.mark.parametrize("message_type", ["", 5, b"t"])
def test_bad_message_types_are_rejected(inbox: Inbox, message_type: Any) -> None:
    with pytest.raises(RegistrationError, match="message type"):
        inbox.handler(message_type)


def test_key_must_be_callable(inbox: Inbox) -> None:
    with pytest.raises(RegistrationError, match="key= must be callable"):
        inbox.handler("t", key="order_id")(module_level)  # type: ignore[arg-type]


def test_constructor_validates_its_options() -> None:
    sessions = sessionmaker(create_engine("sqlite://"))
    with pytest.raises(TypeError, match="session_factory"):
        Inbox("sqlite://")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'sometimes'"):
        Inbox(sessions, on_unhandled="sometimes")
    with pytest.raises(ValueError, match="transient_retries"):
        Inbox(sessions, transient_retries=-1)
    with pytest.raises(ValueError, match="plain identifier"):
        Inbox(sessions, table="inbox; drop table users")


def test_process_rejects_what_is_not_a_message(inbox: Inbox) -> None:
    inbox.handler(module_level)
    with pytest.raises(TypeError, match=r"inbox\.Message"):
        inbox.process({"id": "x"})  # type: ignore[arg-type]


def test_outcomes_compare_equal_to_their_names() -> None:
    assert Outcome.PROCESSED == "processed"
    assert Outcome.DUPLICATE == "duplicate"
    assert Outcome.IGNORED == "ignored"
    assert Unhandled("ignore") is Unhandled.IGNORE


async def async_handler(message: Message, session: Session) -> None:
    """A coroutine function: calling it runs nothing until awaited."""


async def async_generator(message: Message, session: Session) -> Any:
    yield None


class AsyncCallable:
    async def __call__(self, message: Message, session: Session) -> None:
        """An instance whose call returns a coroutine."""


@pytest.mark.parametrize(
    "func",
    [
        async_handler,
        async_generator,
        AsyncCallable(),
        functools.partial(async_handler),
    ],
    ids=["async def", "async generator", "async __call__", "partial of async def"],
)
def test_coroutine_handlers_are_refused_at_registration(inbox: Inbox, func: Any) -> None:
    with pytest.raises(RegistrationError, match="coroutine function"):
        inbox.handler("t", name="async")(func)
    assert inbox.handlers == ()


def test_a_coroutine_key_function_is_refused_at_registration(inbox: Inbox) -> None:
    async def key(message: Message) -> str:
        return "k"

    with pytest.raises(RegistrationError, match="key function"):
        inbox.handler("t", key=key)(module_level)
    assert inbox.handlers == ()


def test_a_handler_returning_an_awaitable_fails_and_commits_nothing() -> None:
    """What registration cannot see (a plain function that returns a coroutine) is caught
    when it returns: the claim is rolled back instead of committed for work never run."""
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))

    def sneaky(message: Message, session: Session) -> Any:
        return async_handler(message, session)

    inbox.handler("t", name="sneaky")(sneaky)
    message = Message.new("t", {})
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert "returned an awaitable" in str(failed.value.failures["sneaky"])
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(inbox_message)).scalar() == 0
    engine.dispose()
