"""Databases for the suite: the three backends, a fresh isolated database per test, and the
``effects`` table every test handler writes to.

Server URLs come from INBOX_TEST_POSTGRES_URL and INBOX_TEST_MARIADB_URL (defaults: the local
servers). A server that cannot be reached skips its tests locally and FAILS them under
CI=true: in CI a missing server is a broken build, never a pass.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox.schema import metadata as inbox_metadata

POSTGRES_URL = os.environ.get(
    "INBOX_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get("INBOX_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() == "true"

SERVER_BACKENDS = ("postgresql", "mariadb")
ALL_BACKENDS = ("sqlite", *SERVER_BACKENDS)

effects_metadata = MetaData()
effects = Table(
    "effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Not unique on purpose: a doubled effect must be counted, not rejected.
    Column("ref", String(64), nullable=False),
    Column("handler", String(255), nullable=False),
)


@dataclass
class Database:
    """A fresh, empty database for one test, with the inbox and effects tables created."""

    backend: str
    url: str
    engine: Engine

    @property
    def sessions(self) -> sessionmaker[Session]:
        """A session factory bound to this database."""
        return sessionmaker(self.engine)

    def effect_counts(self) -> dict[tuple[str, str], int]:
        """(ref, handler) -> number of committed effect rows."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(effects.c.ref, effects.c.handler, func.count()).group_by(
                    effects.c.ref, effects.c.handler
                )
            )
            return {(ref, handler): n for ref, handler, n in rows}

    def count(self, table: Table) -> int:
        """The number of rows in ``table``."""
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def cannot_run(message: str) -> NoReturn:
    """Skip locally, fail in CI: a database or broker test must never pass by not running."""
    if IN_CI:
        pytest.fail(f"{message} (CI=true: database and broker tests must run)")
    pytest.skip(message)


def unreachable(backend: str, exc: Exception) -> NoReturn:
    """A server the test needs is down: :func:`cannot_run`."""
    cannot_run(f"{backend} server not reachable: {type(exc).__name__}: {exc}")


def admin_engine(backend: str) -> Engine:
    """An autocommit engine on the server of ``backend``, for creating and dropping databases."""
    url = POSTGRES_URL if backend == "postgresql" else MARIADB_URL
    return create_engine(url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


def fresh_database(backend: str, admin: dict[str, Engine], tmp_path: Path) -> Iterator[Database]:
    """Create an isolated database for ``backend``, yield it, and drop it afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'inbox-test.db'}"
        drop = None
    else:
        engine = admin[backend]
        try:
            with engine.connect() as connection:
                if backend == "postgresql":
                    connection.execute(text(f"CREATE SCHEMA {name}"))
                else:
                    connection.execute(text(f"CREATE DATABASE {name}"))
        except Exception as exc:
            unreachable(backend, exc)
        base = make_url(POSTGRES_URL if backend == "postgresql" else MARIADB_URL)
        if backend == "postgresql":
            isolated = base.update_query_dict({"options": f"-csearch_path={name}"})
            drop = f"DROP SCHEMA {name} CASCADE"
        else:
            isolated = base.set(database=name)
            drop = f"DROP DATABASE {name}"
        url = isolated.render_as_string(hide_password=False)
    engine = create_engine(url)
    inbox_metadata.create_all(engine)
    effects_metadata.create_all(engine)
    try:
        yield Database(backend, url, engine)
    finally:
        engine.dispose()
        if drop is not None:
            with admin[backend].connect() as connection:
                connection.execute(text(drop))


def own_notifications(listener: Any, schema: str, *, timeout: float, wanted: int = 1) -> list[str]:
    """The payloads ``listener`` (a psycopg connection LISTENing) receives within ``timeout``
    from tables in ``schema``, stopping at ``wanted``: the channel is the server's, and other
    tests' outboxes (another xdist worker's chaos run) notify on it too."""
    received: list[str] = []
    deadline = time.monotonic() + timeout
    while len(received) < wanted and (left := deadline - time.monotonic()) > 0:
        for notice in listener.notifies(timeout=left, stop_after=1):
            if notice.payload.split(".", 1)[0] == schema:
                received.append(notice.payload)
    return received


def current_schema(engine: Engine) -> str:
    """The schema ``engine``'s search path creates tables in (a PostgreSQL test's own)."""
    with engine.connect() as connection:
        return str(connection.execute(text("SELECT current_schema()")).scalar_one())
