"""Backends for the suite: one parametrized fixture runs each test on SQLite, PostgreSQL and
MariaDB, each test in its own fresh schema (PostgreSQL) or database (MariaDB, SQLite file).

Server URLs come from INBOX_TEST_POSTGRES_URL and INBOX_TEST_MARIADB_URL (defaults: the local
servers). A server that cannot be reached skips its tests locally and FAILS them under
CI=true: in CI a missing server is a broken build, never a pass.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError
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
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def cannot_run(message: str) -> None:
    """Skip locally, fail in CI: a database or broker test must never pass by not running."""
    if IN_CI:
        pytest.fail(f"{message} (CI=true: database and broker tests must run)")
    pytest.skip(message)


def unreachable(backend: str, exc: Exception) -> None:
    """A server the test needs is down: :func:`cannot_run`."""
    cannot_run(f"{backend} server not reachable: {type(exc).__name__}: {exc}")


def _admin_engine(backend: str) -> Engine:
    url = POSTGRES_URL if backend == "postgresql" else MARIADB_URL
    return create_engine(url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


@pytest.fixture(scope="session")
def admin_engines() -> Iterator[dict[str, Engine]]:
    engines = {backend: _admin_engine(backend) for backend in SERVER_BACKENDS}
    yield engines
    for engine in engines.values():
        engine.dispose()


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
            url = base.update_query_dict({"options": f"-csearch_path={name}"})
            drop = f"DROP SCHEMA {name} CASCADE"
        else:
            url = base.set(database=name)
            drop = f"DROP DATABASE {name}"
        url = url.render_as_string(hide_password=False)
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


AMQP_URL = os.environ.get("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@dataclass
class Rabbit:
    """A RabbitMQ test area: queue names unique to one test, deleted after it."""

    url: str
    prefix: str

    def queue(self, name: str = "q") -> str:
        """A queue name unique to this test."""
        return f"{self.prefix}.{name}"

    def connection(self) -> Connection:
        return Connection(self.url)

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (0 if it does not exist)."""
        with self.connection() as connection, connection.channel() as channel:
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except ChannelError:
                return 0

    def take_all(self, queue: str) -> list[Any]:
        """Remove and return every message in ``queue`` (kombu messages, acked)."""
        taken: list[Any] = []
        with self.connection() as connection, connection.channel() as channel:
            while (raw := channel.basic_get(queue, no_ack=False)) is not None:
                taken.append(channel.message_to_python(raw))
                channel.basic_ack(raw.delivery_tag)
        return taken

    def delete_queues(self) -> None:
        """Delete every queue whose name starts with this test's prefix."""
        listed = subprocess.run(
            ["rabbitmqctl", "list_queues", "--quiet", "--no-table-headers", "name"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        names = [n for n in listed.stdout.split() if n.startswith(self.prefix)]
        with self.connection() as connection, connection.channel() as channel:
            for name in names:
                channel.queue_delete(queue=name)


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    """RabbitMQ at INBOX_TEST_AMQP_URL; skipped locally if unreachable, a failure under CI."""
    try:
        with Connection(AMQP_URL, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unreachable("rabbitmq", exc)
    area = Rabbit(AMQP_URL, f"t-{uuid.uuid4().hex[:12]}")
    try:
        yield area
    finally:
        area.delete_queues()
