"""Migrations: the shipped revision creates exactly inbox.schema on every backend, downgrades
cleanly, and an application with its own alembic history adds it from an installed wheel."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from conftest import Database, effects_metadata
from sqlalchemy import Engine, MetaData, create_engine, insert, inspect

from alembic import command
from inbox import cleanup
from inbox.schema import inbox_table, metadata, processed_at_index_name

ROOT = Path(__file__).resolve().parent.parent


def repo_config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


def only_inbox_tables(name: str | None, type_: str, parent_names: object) -> bool:
    return type_ != "table" or name in metadata.tables


def diff_against_schema(engine: Engine) -> list[object]:
    """What autogenerate would change to make the database's inbox tables match the schema."""
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": only_inbox_tables}
        )
        return list(compare_metadata(context, metadata))


@pytest.fixture
def empty_db(db: Database) -> Database:
    """The backend's fresh database without the tables the suite's fixture creates."""
    metadata.drop_all(db.engine)
    effects_metadata.drop_all(db.engine)
    return db


def test_upgrade_creates_exactly_the_schema_and_downgrade_removes_it(empty_db: Database) -> None:
    config = repo_config(empty_db.url)

    command.upgrade(config, "head")

    assert diff_against_schema(empty_db.engine) == []
    tables = set(inspect(empty_db.engine).get_table_names())
    assert {"inbox_message", "inbox_alembic_version"} <= tables
    assert "alembic_version" not in tables, "the inbox must not touch the app's version table"

    command.downgrade(config, "base")

    assert "inbox_message" not in inspect(empty_db.engine).get_table_names()
    assert diff_against_schema(empty_db.engine) != [], "the comparison can see a difference"


# Regression (issue 15, bug 13): the index was always named ix_<table>_processed_at, which for
# table names over 47 characters passes PostgreSQL's 63-character limit (SQLAlchemy refuses
# it) and for names over 48 MariaDB's 64 ("Identifier name ... is too long").
@pytest.mark.parametrize("length", [47, 48, 49, 63])
def test_a_long_table_name_gets_an_index_name_every_backend_accepts(
    db: Database, length: int
) -> None:
    name = f"t{uuid.uuid4().hex}".ljust(length, "x")
    table = inbox_table(MetaData(), name)
    table.create(db.engine)
    try:
        [index] = inspect(db.engine).get_indexes(name)
        assert index["column_names"] == ["processed_at"]
        assert index["name"] == processed_at_index_name(name)
        assert len(index["name"]) <= 63
        if length <= 47:  # short names keep the name they always had
            assert index["name"] == f"ix_{name}_processed_at"
        else:  # cut short, and still telling apart names that share their first 38 letters
            assert index["name"] != processed_at_index_name(name[:-1] + "y")
        with db.engine.begin() as connection:
            connection.execute(
                insert(table).values(
                    message_id=uuid.uuid4(), handler="h", processed_at=dt.datetime.now(dt.UTC)
                )
            )
        assert cleanup(db.engine, days=1, table=table).deleted == 0
    finally:
        table.drop(db.engine)


def test_alembic_cli_upgrade_head_from_the_repository(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {**os.environ, "INBOX_DATABASE_URL": url}
    alembic = Path(sys.executable).with_name("alembic")
    done = subprocess.run(
        [str(alembic), "upgrade", "head"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    engine = create_engine(url)
    try:
        assert diff_against_schema(engine) == []
    finally:
        engine.dispose()


APP_ENV = """
import os
from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table, create_engine

import inbox
import inbox.schema

app_metadata = MetaData()
Table("orders", app_metadata, Column("id", Integer, primary_key=True))
# The application's autogenerate target includes the inbox metadata, so autogenerate
# neither drops the inbox table nor proposes to create it again.
target_metadata = [app_metadata, inbox.schema.metadata]
print("inbox imported from", os.path.dirname(inbox.__file__))

engine = create_engine(os.environ["APP_DATABASE_URL"])
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
"""

APP_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "app0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("orders")
"""

APP_INI = """
[alembic]
script_location = %(here)s/migrations
version_locations = %(here)s/migrations/versions inbox:migrations/versions
path_separator = space
"""


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel and installed into a directory of its own."""
    build = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(build),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = build.glob("inbox-*.whl")
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return target


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_app_with_its_own_history_adds_the_inbox_revisions_from_the_wheel(
    installed_wheel: Path, tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
    else:
        db: Database = request.getfixturevalue("pg_db")
        metadata.drop_all(db.engine)
        effects_metadata.drop_all(db.engine)
        url = db.url
    app = tmp_path / "app"
    (app / "migrations" / "versions").mkdir(parents=True)
    (app / "alembic.ini").write_text(APP_INI)
    (app / "migrations" / "env.py").write_text(APP_ENV)
    (app / "migrations" / "versions" / "app0001_orders.py").write_text(APP_REVISION)
    # Only the installed wheel provides `inbox`: the checkout is not on the path.
    env = {**os.environ, "PYTHONPATH": str(installed_wheel), "APP_DATABASE_URL": url}
    alembic = [sys.executable, "-m", "alembic"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*alembic, *args], cwd=app, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    heads = run("heads")
    assert "(inbox)" in heads
    assert "(app)" in heads
    upgraded = run("upgrade", "heads")
    assert f"inbox imported from {installed_wheel / 'inbox'}" in upgraded
    run("check")  # autogenerate finds nothing to do: both histories match their metadata

    engine = create_engine(url)
    try:
        assert {"orders", "inbox_message"} <= set(inspect(engine).get_table_names())
        assert diff_against_schema(engine) == []
    finally:
        engine.dispose()

    run("downgrade", "inbox@base")
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert "inbox_message" not in tables
    assert "orders" in tables
