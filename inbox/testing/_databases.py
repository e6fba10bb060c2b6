"""Throwaway databases for tests: a SQLite file, or a fresh schema (PostgreSQL) or database
(MariaDB, MySQL) on a server, with the inbox's tables and the application's created, dropped
afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateSchema, DropSchema

from inbox._backends import family_of_url, server_families
from inbox.errors import ConfigurationError
from inbox.schema import metadata as inbox_metadata

__all__ = ["DATABASE_URL_ENV", "ThrowawayDatabase", "server_url_of", "throwaway_database"]

DATABASE_URL_ENV: Final = "INBOX_TESTING_DATABASE_URL"
"""The environment variable naming the server the fixtures create their databases on."""


@dataclass(frozen=True)
class ThrowawayDatabase:
    """A database that exists for one test: its ``url`` (an engine of your own made from it
    sees the same tables) and an ``engine`` on it."""

    url: str
    engine: Engine

    def __repr__(self) -> str:
        return f"ThrowawayDatabase({self.engine.url!r})"  # the engine's URL hides the password

    @property
    def sessions(self) -> sessionmaker[Session]:
        """A session factory on :attr:`engine`, what ``Inbox(...)`` takes."""
        return sessionmaker(self.engine)


@contextmanager
def throwaway_database(
    server_url: str | URL | None, directory: Path, metadata: Sequence[MetaData] = ()
) -> Iterator[ThrowawayDatabase]:
    """A fresh database with the inbox tables and every table of ``metadata`` created:
    ``inbox.db`` in ``directory`` without ``server_url``, else a new schema (PostgreSQL) or
    database (MariaDB, MySQL) on that server, dropped on exit."""
    if server_url is None:
        url = f"sqlite:///{directory / 'inbox.db'}"
        with _created(url, metadata) as database:
            yield database
        return
    base = server_url_of(server_url)
    name = f"inbox_test_{uuid.uuid4().hex[:16]}"
    family = family_of_url(base)
    admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            # MySQL's and MariaDB's CREATE SCHEMA is CREATE DATABASE.
            connection.execute(CreateSchema(name))
    except Exception as exc:
        admin.dispose()
        where = base.render_as_string(hide_password=True)
        raise RuntimeError(
            f"cannot create a throwaway database on {where} ({DATABASE_URL_ENV} or "
            f"--inbox-database-url): {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None  # the driver's traceback would show the password it was given
    isolated = family.throwaway_url(base, name)
    try:
        with _created(isolated.render_as_string(hide_password=False), metadata) as database:
            yield database
    finally:
        with admin.connect() as connection:
            connection.execute(DropSchema(name, cascade=family.drops_schemas_cascading))
        admin.dispose()


def server_url_of(server_url: str | URL) -> URL:
    """``server_url`` parsed (a URL's repr hides its password, in tracebacks too);
    ValueError unless it names a PostgreSQL, MariaDB or MySQL server."""
    url = server_url if isinstance(server_url, URL) else _parsed(server_url)
    servers = server_families()
    if url.get_backend_name() not in servers:
        raise ConfigurationError(
            f"{DATABASE_URL_ENV}: the fixtures create databases on {', '.join(servers)} "
            f"servers (SQLite is the default without a URL), got {url.get_backend_name()!r}"
        )
    return url


def _parsed(server_url: str) -> URL:
    try:
        url = make_url(server_url)
    except Exception as exc:
        raise ConfigurationError(f"{DATABASE_URL_ENV}: not a database URL ({exc})") from None
    return url


@contextmanager
def _created(url: str, metadata: Sequence[MetaData]) -> Iterator[ThrowawayDatabase]:
    engine = create_engine(url)
    try:
        inbox_metadata.create_all(engine)
        for each in metadata:
            each.create_all(engine)
        yield ThrowawayDatabase(url, engine)
    finally:
        engine.dispose()
