"""The start check: the inbox tables exist, with every column, at the revision this version
needs; ``inbox-worker`` exits 1 with one line naming the command to run when they do not."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Column, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.exc import DBAPIError
from support.databases import Database, effects_metadata
from support.rabbit import Rabbit
from support.worker import TIMEOUT, WorkerProcess, wait_until, worker_command

from inbox.broker.cli import worker_main
from inbox.core._startup import (
    APP_VERSION_TABLE,
    SchemaNotReady,
    _unreachable,
    check_schema,
    inbox_revisions,
    required_revision,
    wait_for_schema,
)
from inbox.outbox.relay.cli import relay_main
from inbox.schema import inbox_effect, inbox_message, metadata, outbox_message

ROOT = Path(__file__).resolve().parent.parent
FIRST_REVISION = "5c1f0e2a9b3d"
ALL_TABLES = (inbox_message, inbox_effect, outbox_message)

APP = """
    import os

    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from inbox import Inbox

    inbox = Inbox(sessionmaker(sa.create_engine(os.environ["STARTUP_APP_URL"])))


    @inbox.handler("op", name="ops.apply")
    def apply(message, session):
        pass
"""


def repo_config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


@pytest.fixture
def empty_db(db: Database) -> Database:
    """The backend's fresh database without any table."""
    metadata.drop_all(db.engine)
    effects_metadata.drop_all(db.engine)
    return db


def one_line_error(check: Database, tables: tuple[Table, ...] = ALL_TABLES) -> str:
    with pytest.raises(SchemaNotReady) as raised:
        check_schema(check.engine, tables)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_tables_made_by_create_all_pass(db: Database) -> None:
    check_schema(db.engine, ALL_TABLES)


def test_a_missing_table_is_named_with_both_ways_to_create_it(db: Database) -> None:
    inbox_effect.drop(db.engine)

    message = one_line_error(db)

    assert message.startswith("table inbox_effect does not exist: ")
    assert "`alembic upgrade heads`" in message
    assert "inbox.schema.metadata.create_all(engine)" in message
    check_schema(db.engine, (inbox_message, outbox_message))  # only what a process uses


def test_a_missing_column_is_named(db: Database) -> None:
    inbox_effect.drop(db.engine)
    older = Table(
        "inbox_effect",
        MetaData(),
        *(
            Column(c.name, c.type, primary_key=c.primary_key)
            for c in inbox_effect.columns
            if c.name not in ("result", "error")
        ),
    )
    older.create(db.engine)

    message = one_line_error(db)

    assert message.startswith("table inbox_effect lacks column(s) result, error ")


def test_the_shipped_revisions_at_an_older_revision_name_alembic_upgrade_head(
    empty_db: Database,
) -> None:
    config = repo_config(empty_db.url)
    command.upgrade(config, FIRST_REVISION)

    message = one_line_error(empty_db, (inbox_message,))

    assert message == (
        f"the database is at inbox revision {FIRST_REVISION} (inbox_alembic_version), this "
        f"version of inbox needs {required_revision()}: run `inbox migrate` "
        "(docs/migrations.md)"
    )

    command.upgrade(config, "head")

    check_schema(empty_db.engine, ALL_TABLES)


def test_an_app_history_at_an_older_inbox_revision_names_alembic_upgrade_heads(
    empty_db: Database,
) -> None:
    # What alembic writes for an application whose history includes the inbox branch: one
    # row per branch head, the application's and the inbox's.
    inbox_message.create(empty_db.engine)
    versions = Table(APP_VERSION_TABLE, MetaData(), Column("version_num", String(32)))
    versions.create(empty_db.engine)
    with empty_db.engine.begin() as connection:
        connection.execute(
            insert(versions), [{"version_num": "a1b2c3d4e5f6"}, {"version_num": FIRST_REVISION}]
        )

    message = one_line_error(empty_db)

    assert "(alembic_version)" in message
    assert message.endswith("run `alembic upgrade heads` (docs/migrations.md)")


def test_a_version_table_without_inbox_revisions_falls_back_to_the_columns(db: Database) -> None:
    # A merged history, or the application's own revision of a partitioned table.
    versions = Table(APP_VERSION_TABLE, MetaData(), Column("version_num", String(32)))
    versions.create(db.engine)
    with db.engine.begin() as connection:
        connection.execute(insert(versions), [{"version_num": "a1b2c3d4e5f6"}])

    check_schema(db.engine, ALL_TABLES)

    inbox_message.drop(db.engine)
    assert one_line_error(db).startswith("table inbox_message does not exist")


def test_the_required_revision_is_the_newest_shipped_one() -> None:
    revisions = inbox_revisions()
    assert revisions[-1] == FIRST_REVISION
    assert required_revision() == revisions[0] != FIRST_REVISION
    shipped = {p.name.split("_")[0] for p in (ROOT / "inbox/migrations/versions").glob("*.py")}
    assert set(revisions) == shipped


# --- inbox-worker -------------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "startup_app.py").write_text(textwrap.dedent(APP))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "startup_app", raising=False)
    return tmp_path


def start_worker(app_dir: Path, url: str, broker: str, queue: str) -> WorkerProcess:
    log_path = app_dir / "worker.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "startup_app:inbox",
                "--broker",
                broker,
                "--queue",
                queue,
                "--connect-retries",
                "0",
            ],
            stderr=log,
            cwd=app_dir,
            env={
                **os.environ,
                "STARTUP_APP_URL": url,
                "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")]),
            },
        )
    return WorkerProcess("inbox-worker", process, log_path)


@pytest.mark.parametrize("backend_revision", [None, FIRST_REVISION])
def test_the_worker_exits_1_with_one_line_before_the_migrations(
    app_dir: Path, empty_db: Database, rabbit: Rabbit, backend_revision: str | None
) -> None:
    if backend_revision is not None:
        command.upgrade(repo_config(empty_db.url), backend_revision)

    worker = start_worker(app_dir, empty_db.url, rabbit.url, rabbit.queue())

    assert worker.wait() == 1
    lines = [line for line in worker.log().splitlines() if line.strip()]
    expected = (
        "table inbox_message does not exist: run the inbox migrations (`inbox migrate`, or "
        if backend_revision is None
        else f"the database is at inbox revision {FIRST_REVISION} (inbox_alembic_version)"
    )
    assert len(lines) == 1, worker.tail()
    assert lines[0].startswith(f"inbox-worker: error: {expected}")
    assert rabbit.depth(rabbit.queue()) == 0  # nothing was declared or consumed


def test_the_worker_starts_at_the_head_revision(
    app_dir: Path, empty_db: Database, rabbit: Rabbit
) -> None:
    command.upgrade(repo_config(empty_db.url), "head")

    worker = start_worker(app_dir, empty_db.url, rabbit.url, rabbit.queue())
    try:
        wait_until(
            lambda: "consuming" in worker.log() or worker.process.poll() is not None,
            "the worker to start",
            TIMEOUT,
        )
        assert worker.process.poll() is None, worker.tail()
    finally:
        code = worker.terminate()
    assert code == 0, worker.tail()


def test_no_schema_check_starts_without_tables(
    app_dir: Path, empty_db: Database, rabbit: Rabbit
) -> None:
    worker = start_worker(app_dir, empty_db.url, rabbit.url, rabbit.queue())
    assert worker.wait() == 1

    log_path = app_dir / "unchecked.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "startup_app:inbox",
                "--broker",
                rabbit.url,
                "--queue",
                rabbit.queue(),
                "--no-schema-check",
            ],
            stderr=log,
            cwd=app_dir,
            env={
                **os.environ,
                "STARTUP_APP_URL": empty_db.url,
                "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")]),
            },
        )
    unchecked = WorkerProcess("unchecked", process, log_path)
    try:
        wait_until(lambda: "consuming" in unchecked.log(), "the unchecked worker to start", TIMEOUT)
    finally:
        assert unchecked.terminate() == 0, unchecked.tail()


def test_an_unreachable_database_is_one_line_without_the_password(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STARTUP_APP_URL", "postgresql+psycopg://app:s3cret-pw@127.0.0.1:1/app")
    err = io.StringIO()

    code = worker_main(
        ["startup_app:inbox", "--broker", "memory://", "--queue", "q", "--connect-retries", "0"],
        stderr=err,
    )

    assert code == 1
    [line] = [x for x in err.getvalue().splitlines() if x.startswith("inbox-worker:")]
    assert line.startswith("inbox-worker: error: OperationalError: ")
    assert line.endswith("(database postgresql+psycopg://app:***@127.0.0.1:1/app)")
    assert "s3cret-pw" not in err.getvalue()


def test_version_names_the_release_and_the_schema_revision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert worker_main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("inbox-worker ")
    assert out.endswith(f"(inbox schema revision {required_revision()})\n")
    assert relay_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("inbox-relay ")


def test_an_unreadable_version_table_falls_back_to_the_columns(pg_db: Database) -> None:
    role = f"startup_{os.getpid()}"
    schema = pg_db.engine.url.query["options"].partition("search_path=")[2]
    versions = Table("inbox_alembic_version", MetaData(), Column("version_num", String(32)))
    versions.create(pg_db.engine)
    with pg_db.engine.begin() as connection:
        connection.execute(insert(versions), [{"version_num": FIRST_REVISION}])
        connection.execute(text(f"DROP ROLE IF EXISTS {role}"))
        connection.execute(text(f"CREATE ROLE {role} LOGIN"))
        connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {role}"))
        connection.execute(text(f"GRANT INSERT, SELECT ON inbox_message, inbox_effect TO {role}"))
    worker_engine = create_engine(pg_db.engine.url.set(username=role))
    try:
        # The role cannot read the version table: the columns decide, and they are there.
        check_schema(worker_engine, (inbox_message, inbox_effect))
        with pytest.raises(SchemaNotReady):
            check_schema(pg_db.engine, (inbox_message, inbox_effect))
    finally:
        worker_engine.dispose()
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP OWNED BY {role}"))
            connection.execute(text(f"DROP ROLE {role}"))


@pytest.mark.parametrize(
    ("url", "waiting_helps"),
    [
        ("postgresql+psycopg://postgres@127.0.0.1:1/test", True),  # refused
        ("postgresql+psycopg://postgres@127.0.0.1:5432/no_such_db", False),
        ("mysql+pymysql://root@127.0.0.1:1/test", True),
        ("mysql+pymysql://root@127.0.0.1:3306/no_such_db", False),
        ("sqlite:////no/such/dir/inbox.db", False),
    ],
)
def test_only_an_unreachable_server_is_waited_for(url: str, waiting_helps: bool) -> None:
    engine = create_engine(url)
    try:
        with pytest.raises(DBAPIError) as raised:
            wait_for_schema(engine, ALL_TABLES, retries=0)
    finally:
        engine.dispose()

    assert _unreachable(raised.value) is waiting_helps


STORE_APP = """
    import os

    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from inbox import Inbox

    inbox = Inbox(
        sessionmaker(sa.create_engine(os.environ["STARTUP_APP_URL"])),
        effect_store=sa.create_engine(os.environ["STARTUP_STORE_URL"]),
        effect_table="app_effects",
    )
"""


def test_an_effect_store_of_its_own_is_checked_for_its_effect_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "store_app.py").write_text(textwrap.dedent(STORE_APP))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "store_app", raising=False)
    inbox_db = create_engine(f"sqlite:///{tmp_path / 'inbox.db'}")
    inbox_message.create(inbox_db)  # no effect table here: the effects live in the store
    inbox_db.dispose()
    monkeypatch.setenv("STARTUP_APP_URL", f"sqlite:///{tmp_path / 'inbox.db'}")
    monkeypatch.setenv("STARTUP_STORE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    argv = ["store_app:inbox", "--broker", "memory://", "--queue", "q", "--connect-retries", "0"]
    err = io.StringIO()

    assert worker_main(argv, stderr=err) == 1

    [line] = [x for x in err.getvalue().splitlines() if x.startswith("inbox-worker:")]
    assert line.startswith("inbox-worker: error: table app_effects does not exist: ")
