"""Fixtures for the suite; the helpers they use live in the :mod:`support` package.

One parametrized fixture runs each database test on SQLite, PostgreSQL and MariaDB, each test
in its own fresh schema (PostgreSQL) or database (MariaDB, SQLite file). A server that cannot
be reached skips its tests locally and FAILS them under CI=true.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from support.aio import SHARED_CASES, AsyncInboxAsBlocking
from support.databases import (
    ALL_BACKENDS,
    SERVER_BACKENDS,
    Database,
    admin_engine,
    fresh_database,
)
from support.rabbit import Rabbit, rabbit_area

INBOX_FLAVOURS = ("blocking", "async")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One suite, both flavours: the shared cases run through Inbox and through AsyncInbox."""
    if metafunc.function.__name__ in SHARED_CASES.get(metafunc.module.__name__, ()):
        metafunc.parametrize("inbox_flavour", INBOX_FLAVOURS, indirect=True)


@pytest.fixture(autouse=True)
def inbox_flavour(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """ "blocking" for every test; for a shared case's "async" run, every ``Inbox(...)`` its
    module makes is an AsyncInbox in disguise (see support.aio.SHARED_CASES)."""
    flavour: str = getattr(request, "param", "blocking")
    if flavour == "blocking":
        yield flavour
        return
    monkeypatch.setattr(request.module, "Inbox", AsyncInboxAsBlocking)
    made = AsyncInboxAsBlocking.made
    made.clear()
    yield flavour
    assert made, "the case never made an inbox: it did not run through the async inbox"
    for inbox in made:
        inbox.close()
    made.clear()


# Loggers the console scripts tune when a test runs one in this process (worker_main etc.).
_TUNED_LOGGERS = ("", "inbox", "inbox.core", "inbox.worker", "kombu", "amqp", "alembic")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo what an in-process console script did to logging (levels, root handlers), so a
    later test's caplog sees the records it expects whatever ran before it."""
    loggers = [logging.getLogger(name) for name in _TUNED_LOGGERS]
    levels = [logger.level for logger in loggers]
    handlers = logging.getLogger().handlers[:]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)
    logging.getLogger().handlers[:] = handlers


@pytest.fixture(scope="session")
def admin_engines() -> Iterator[dict[str, Engine]]:
    """One autocommit engine per server, shared by the whole session."""
    engines = {backend: admin_engine(backend) for backend in SERVER_BACKENDS}
    yield engines
    for engine in engines.values():
        engine.dispose()


@pytest.fixture(params=ALL_BACKENDS)
def db(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[Database]:
    """A fresh database on every backend: the one suite runs on all three."""
    yield from fresh_database(request.param, admin_engines, tmp_path)


@pytest.fixture(params=SERVER_BACKENDS)
def server_db(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[Database]:
    """A fresh database on the real servers only (PostgreSQL, MariaDB): for concurrency."""
    yield from fresh_database(request.param, admin_engines, tmp_path)


@pytest.fixture
def pg_db(admin_engines: dict[str, Engine], tmp_path: Path) -> Iterator[Database]:
    """A fresh PostgreSQL schema."""
    yield from fresh_database("postgresql", admin_engines, tmp_path)


@pytest.fixture
def mariadb_db(admin_engines: dict[str, Engine], tmp_path: Path) -> Iterator[Database]:
    """A fresh MariaDB database."""
    yield from fresh_database("mariadb", admin_engines, tmp_path)


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    """RabbitMQ at INBOX_TEST_AMQP_URL; skipped locally if unreachable, a failure under CI."""
    with rabbit_area() as area:
        yield area
