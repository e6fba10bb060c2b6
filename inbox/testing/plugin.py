"""The inbox's pytest plugin: fixtures for testing handlers, loaded through the ``pytest11``
entry point ``inbox``.

Every fixture is named ``inbox_*`` and does nothing until a test asks for it: no database is
created and nothing beyond ``inbox`` is imported for a test that uses none of them.

``inbox_database`` is a throwaway database with the inbox's tables and those of
``inbox_app_metadata`` (override that fixture to return your ``MetaData``): a SQLite file by
default, or a new schema (PostgreSQL) or database (MariaDB, MySQL) on the server named by
``--inbox-database-url`` or the ``INBOX_TESTING_DATABASE_URL`` environment variable, dropped
after the test. See docs/testing.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sqlalchemy import Engine, MetaData
    from sqlalchemy.engine import URL
    from sqlalchemy.orm import Session, sessionmaker

    from inbox.core import Inbox
    from inbox.testing._databases import ThrowawayDatabase
    from inbox.testing.fakes import FakeProvider
    from inbox.testing.harness import WorkerHarness

__all__ = [
    "inbox_app_metadata",
    "inbox_database",
    "inbox_database_url",
    "inbox_effect_store",
    "inbox_engine",
    "inbox_fake_provider",
    "inbox_sessions",
    "inbox_worker_harness",
    "pytest_addoption",
]

_ENV = "INBOX_TESTING_DATABASE_URL"  # _databases.DATABASE_URL_ENV, without importing it


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--inbox-database-url``: the server the ``inbox_database`` fixture creates on."""
    group = parser.getgroup("inbox", "inbox (transactional inbox) testing")
    group.addoption(
        "--inbox-database-url",
        default=None,
        help=(
            "PostgreSQL, MariaDB or MySQL server URL on which each test using inbox_database "
            f"gets a fresh schema or database (default: ${_ENV}, else a SQLite file)"
        ),
    )


@pytest.fixture(scope="session")
def inbox_database_url(pytestconfig: pytest.Config) -> URL | None:
    """The server URL the throwaway databases are created on (a SQLAlchemy ``URL``, whose
    repr hides the password); None for SQLite files."""
    option: str | None = pytestconfig.getoption("inbox_database_url")
    given = option or os.environ.get(_ENV)
    if not given:
        return None
    from inbox.testing._databases import server_url_of

    return server_url_of(given)


@pytest.fixture
def inbox_app_metadata() -> MetaData | Sequence[MetaData]:
    """Your application's tables, created in every throwaway database: override this
    fixture to return your ``MetaData`` (or several). Default: none."""
    return ()


@pytest.fixture
def inbox_database(
    inbox_database_url: URL | None,
    inbox_app_metadata: MetaData | Sequence[MetaData],
    tmp_path: Path,
) -> Iterator[ThrowawayDatabase]:
    """A fresh database for this test with the inbox tables and your tables created
    (``.url``, ``.engine``, ``.sessions``); dropped afterwards."""
    from sqlalchemy import MetaData

    from inbox.testing._databases import throwaway_database

    metadata = (
        [inbox_app_metadata]
        if isinstance(inbox_app_metadata, MetaData)
        else list(inbox_app_metadata)
    )
    with throwaway_database(inbox_database_url, tmp_path, metadata) as database:
        yield database


@pytest.fixture
def inbox_engine(inbox_database: ThrowawayDatabase) -> Engine:
    """The engine of ``inbox_database``."""
    return inbox_database.engine


@pytest.fixture
def inbox_sessions(inbox_database: ThrowawayDatabase) -> sessionmaker[Session]:
    """A session factory on ``inbox_database``: ``Inbox(inbox_sessions)``."""
    return inbox_database.sessions


@pytest.fixture
def inbox_effect_store(
    inbox_database: ThrowawayDatabase, tmp_path: Path
) -> Iterator[Engine | None]:
    """What to pass as ``Inbox(..., effect_store=)`` for ``inbox.effect``: on SQLite an
    engine on a second file with the effect table (SQLite needs one, docs/effects.md); on
    a server None (the effects are kept in the inbox's own database)."""
    from inbox._backends import family_of

    if not family_of(inbox_database.engine).one_writer_at_a_time:
        yield None
        return
    from sqlalchemy import create_engine

    from inbox.schema import metadata

    store = create_engine(f"sqlite:///{tmp_path / 'inbox-effects.db'}")
    metadata.create_all(store)
    yield store
    store.dispose()


@pytest.fixture
def inbox_fake_provider() -> FakeProvider:
    """A :class:`~inbox.testing.FakeProvider` to hand to ``inbox.effect``."""
    from inbox.testing.fakes import FakeProvider

    return FakeProvider()


@pytest.fixture
def inbox_worker_harness() -> Iterator[Callable[..., WorkerHarness]]:
    """Make a :class:`~inbox.testing.WorkerHarness` for an inbox (``harness(inbox,
    retry=..., batch_size=...)``): the real worker on the in-memory broker, its queues
    deleted after the test."""
    from inbox.testing.harness import WorkerHarness

    made: list[WorkerHarness] = []

    def make(inbox: Inbox, **options: Any) -> WorkerHarness:
        harness = WorkerHarness(inbox, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
