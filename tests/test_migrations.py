"""Migrations: the shipped revision creates exactly inbox.schema on every backend, downgrades
cleanly, and an application with its own alembic history adds it from an installed wheel."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import URL, Engine, MetaData, create_engine, insert, inspect, make_url, text
from support.databases import Database, effects_metadata

from inbox import cleanup
from inbox.schema import inbox_table, metadata, processed_at_index_name

ROOT = Path(__file__).resolve().parent.parent
PIP = [sys.executable, "-m", "pip"]


def repo_config(url: str | URL) -> Config:
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


# Regression (issue 15, bug 13): alembic/env.py connected with str(url), and str() of a
# SQLAlchemy URL object masks its password as "***": a URL object given as the config's
# "url" attribute failed to log in. MariaDB, because the suite's PostgreSQL trusts every
# password.
def test_the_repository_env_keeps_the_password_of_a_url_object(
    mariadb_db: Database, admin_engines: dict[str, Engine]
) -> None:
    metadata.drop_all(mariadb_db.engine)
    effects_metadata.drop_all(mariadb_db.engine)
    url = make_url(mariadb_db.url)
    user, password = f"u_{uuid.uuid4().hex[:12]}", f"pw-{uuid.uuid4().hex}"
    admin = admin_engines["mariadb"]
    with admin.connect() as connection:
        connection.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"))
        connection.execute(text(f"GRANT ALL ON `{url.database}`.* TO '{user}'@'%'"))
    try:
        command.upgrade(repo_config(url.set(username=user, password=password)), "head")
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP USER '{user}'@'%'"))
    assert "inbox_message" in inspect(mariadb_db.engine).get_table_names()


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
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel, once for the module."""
    build = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(build), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = build.glob("sqlalchemy_inbox-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed_wheel(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package installed from its wheel into a directory of its own."""
    wheel = built_wheel
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


@pytest.fixture(scope="module")
def fresh_venv(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the package installed from its built wheel (console
    scripts included); its other dependencies come from the suite's environment."""
    venv = tmp_path_factory.mktemp("recipe-venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # SQLAlchemy, alembic and the drivers from the suite's environment; `inbox` only from
    # the wheel (a path in a .pth file does not run the editable install's own .pth).
    suite_site = next(p for p in sys.path if p.endswith("site-packages"))
    (Path(site) / "suite_dependencies.pth").write_text(suite_site + "\n")
    subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", "-q", str(built_wheel)],
        check=True,
        capture_output=True,
    )
    return venv


RECIPE_MODELS = """
from sqlalchemy import Column, Integer, MetaData, Table

metadata = MetaData()
Table("orders", metadata, Column("id", Integer, primary_key=True))
"""

# What docs/migrations.md tells the user to change in the env.py `alembic init` wrote.
RECIPE_ENV_IMPORTS = """
import inbox.schema
from inbox.migrations import app_revisions

import app_models

target_metadata = [app_models.metadata, inbox.schema.metadata]
"""


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} has no {old!r}: did alembic init change?"
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("route", ["helper", "flags"])
def test_the_documented_recipe_in_a_fresh_alembic_init_folder(
    fresh_venv: Path, pg_db: Database, tmp_path: Path, route: str
) -> None:
    """The recipe of docs/migrations.md, followed from an installed wheel in a folder made by
    `alembic init`, against PostgreSQL, both ways it documents: with the app_revisions
    helper in env.py (which refuses the misconfigured ini with the fix in its message), or
    with the --head/--branch-label/--version-path flags. Upgrade creates the inbox table,
    the first app revision starts the app's own branch in the app's folder, and later
    revisions (autogenerated or not) chain on it; nothing lands in the installed package."""
    metadata.drop_all(pg_db.engine)
    effects_metadata.drop_all(pg_db.engine)
    app = tmp_path / "app"
    app.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def alembic(*args: str, ok: bool = True) -> str:
        done = subprocess.run(
            [str(fresh_venv / "bin" / "python"), "-m", "alembic", *args],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        output = done.stdout + done.stderr
        assert (done.returncode == 0) == ok, output
        return output

    alembic("init", "migrations")
    ini, env_py = app / "alembic.ini", app / "migrations" / "env.py"
    url = pg_db.url.replace("%", "%%")  # configparser interpolation
    edit(ini, "sqlalchemy.url = driver://user:pass@localhost/dbname", f"sqlalchemy.url = {url}")
    edit(
        ini,
        "# version_locations = %(here)s/bar:%(here)s/bat:%(here)s/alembic/versions",
        "version_locations = %(here)s/migrations/versions inbox:migrations/versions",
    )
    (app / "app_models.py").write_text(RECIPE_MODELS)
    edit(env_py, "target_metadata = None", RECIPE_ENV_IMPORTS)
    first_flags: tuple[str, ...] = ()
    later_flags: tuple[str, ...] = ()
    if route == "helper":
        edit(
            env_py,
            "connection=connection, target_metadata=target_metadata",
            "connection=connection, target_metadata=target_metadata, "
            "process_revision_directives=app_revisions(config)",
        )
        # alembic init's `path_separator = os` splits inbox:migrations/versions at its colon.
        assert "path_separator = space" in alembic("upgrade", "heads", ok=False)
        edit(ini, "path_separator = os", "path_separator = space")
        assert "revision_environment must be true" in alembic("upgrade", "heads", ok=False)
        edit(ini, "# revision_environment = false", "revision_environment = true")
    else:
        # Without the helper, the same trap is silent: no inbox revision is found at all.
        assert "(inbox)" not in alembic("heads")
        edit(ini, "path_separator = os", "path_separator = space")
        first_flags = ("--head", "base", "--branch-label", "app")
        first_flags += ("--version-path", "migrations/versions")
        later_flags = ("--head", "app@head")

    assert "(inbox)" in alembic("heads")
    alembic("upgrade", "heads")
    assert "inbox_message" in inspect(pg_db.engine).get_table_names()

    versions = app / "migrations" / "versions"
    if route == "helper":  # without the inbox metadata, autogenerate would drop its table
        complete = "target_metadata = [app_models.metadata, inbox.schema.metadata]"
        edit(env_py, complete, "target_metadata = [app_models.metadata]")
        refused = alembic("revision", "--autogenerate", "-m", "orders", ok=False)
        assert "add inbox.schema.metadata to target_metadata" in refused
        assert not list(versions.glob("*.py"))
        edit(env_py, "target_metadata = [app_models.metadata]", complete)
    alembic("revision", "--autogenerate", "-m", "orders", *first_flags)
    [first] = versions.glob("*_orders.py")
    text = first.read_text()
    # (The annotations alembic's template writes differ between its releases.)
    assert re.search(r"^branch_labels(: [^=]+)? = \('app',\)$", text, re.MULTILINE), text
    assert re.search(r"^down_revision(: [^=]+)? = None$", text, re.MULTILINE), text
    assert "op.create_table('orders'" in text
    assert "inbox_message" not in text
    alembic("upgrade", "heads")

    (app / "app_models.py").write_text(
        RECIPE_MODELS + 'Table("customers", metadata, Column("id", Integer, primary_key=True))\n'
    )
    alembic("revision", "--autogenerate", "-m", "customers", *later_flags)
    [second] = versions.glob("*_customers.py")
    first_id = first.name.split("_")[0]
    down = rf"^down_revision(: [^=]+)? = '{first_id}'$"
    assert re.search(down, second.read_text(), re.MULTILINE), second.read_text()
    alembic("revision", "-m", "by hand", *later_flags)  # not autogenerated: placed all the same
    [third] = versions.glob("*_by_hand.py")
    second_id = second.name.split("_")[0]
    assert f"= '{second_id}'" in third.read_text()
    alembic("upgrade", "heads")
    alembic("check")

    tables = set(inspect(pg_db.engine).get_table_names())
    assert {"inbox_message", "orders", "customers", "alembic_version"} <= tables
    assert diff_against_schema(pg_db.engine) == []
    installed = fresh_venv.glob("lib/python*/site-packages/inbox/migrations/versions/*.py")
    assert sorted(p.name for p in installed) == [
        "5c1f0e2a9b3d_create_inbox_message.py",
        "6d2a1f3b8c4e_create_outbox_message.py",
        "7e3b2a4c9d5f_create_inbox_effect.py",
        "8f4c3b5d0e6a_create_inbox_task_result.py",
        "9a5e4c6d1f7b_create_inbox_dead_letter_archive.py",
    ]
    cleanup_script = fresh_venv / "bin" / "inbox-cleanup"
    done = subprocess.run(
        [str(cleanup_script), "--days", "30", "--database-url", pg_db.url],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "deleted 0 claims" in done.stdout
