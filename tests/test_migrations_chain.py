"""The outbox and effect revisions: each upgrades a database that already holds claims
without touching them, and each downgrade removes only its own table, on every backend."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, MetaData, inspect, select, text
from support.databases import Database, current_schema, effects_metadata, own_notifications

from inbox.schema import (
    OUTBOX_NOTIFY_CHANNEL,
    inbox_message,
    metadata,
    outbox_message,
    outbox_table,
)

ROOT = Path(__file__).resolve().parent.parent
FIRST, OUTBOX, EFFECTS, RESULTS = "5c1f0e2a9b3d", "6d2a1f3b8c4e", "7e3b2a4c9d5f", "8f4c3b5d0e6a"
ARCHIVE = "9a5e4c6d1f7b"


def config_for(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def version(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return connection.execute(text("SELECT version_num FROM inbox_alembic_version")).scalar()


def schema_diff(engine: Engine) -> list[object]:
    def ours(name: str | None, type_: str, parent_names: object) -> bool:
        return type_ != "table" or name in metadata.tables

    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": ours}
        )
        return list(compare_metadata(context, metadata))


@pytest.fixture
def empty_db(db: Database) -> Database:
    metadata.drop_all(db.engine)
    effects_metadata.drop_all(db.engine)
    return db


def test_upgrading_a_database_with_claims_keeps_every_claim(empty_db: Database) -> None:
    config = config_for(empty_db.url)
    command.upgrade(config, FIRST)
    assert tables(empty_db.engine) >= {"inbox_message"}
    assert not tables(empty_db.engine) & {"outbox_message", "inbox_effect", "inbox_task_result"}
    now = dt.datetime.now(dt.UTC)
    claims = [
        {"message_id": uuid.uuid4(), "handler": f"h{i}", "processed_at": now} for i in range(50)
    ]
    with empty_db.engine.begin() as connection:
        connection.execute(inbox_message.insert(), claims)

    command.upgrade(config, "head")

    assert version(empty_db.engine) == ARCHIVE
    assert tables(empty_db.engine) >= {
        "inbox_message",
        "outbox_message",
        "inbox_effect",
        "inbox_task_result",
        "inbox_dead_letter_archive",
    }
    assert schema_diff(empty_db.engine) == [], "the metadata and the revisions agree"
    with empty_db.engine.connect() as connection:
        kept = connection.execute(select(inbox_message.c.message_id, inbox_message.c.handler))
        assert {(row.message_id, row.handler) for row in kept} == {
            (c["message_id"], c["handler"]) for c in claims
        }


def test_each_downgrade_removes_only_its_own_table(empty_db: Database) -> None:
    config = config_for(empty_db.url)
    command.upgrade(config, "head")
    now = dt.datetime.now(dt.UTC)
    with empty_db.engine.begin() as connection:
        connection.execute(
            inbox_message.insert().values(message_id=uuid.uuid4(), handler="h", processed_at=now)
        )

    command.downgrade(config, "-1")
    assert version(empty_db.engine) == RESULTS
    assert "inbox_dead_letter_archive" not in tables(empty_db.engine)
    assert "inbox_task_result" in tables(empty_db.engine)

    command.downgrade(config, "-1")
    assert version(empty_db.engine) == EFFECTS
    assert "inbox_task_result" not in tables(empty_db.engine)
    assert {"inbox_message", "outbox_message", "inbox_effect"} <= tables(empty_db.engine)

    command.downgrade(config, "-1")
    assert version(empty_db.engine) == OUTBOX
    assert "inbox_effect" not in tables(empty_db.engine)
    assert {"inbox_message", "outbox_message"} <= tables(empty_db.engine)

    command.downgrade(config, "-1")
    assert version(empty_db.engine) == FIRST
    assert "outbox_message" not in tables(empty_db.engine)
    assert empty_db.count(inbox_message) == 1, "the claims are untouched"

    command.upgrade(config, "head")  # and back up again: nothing was left behind
    assert schema_diff(empty_db.engine) == []


def notified_on_commit(engine: Engine, schema: str, insert_into: object) -> list[str]:
    """Insert a row through ``insert_into`` and return the payloads a listener received from
    tables in ``schema``."""
    import psycopg

    url = engine.url.set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as listener:
        listener.execute(f"LISTEN {OUTBOX_NOTIFY_CHANNEL}")
        with engine.begin() as connection:
            connection.execute(insert_into)  # type: ignore[call-overload]
            early = own_notifications(listener, schema, timeout=0.2)
            assert early == [], "nothing before the commit"
        return own_notifications(listener, schema, timeout=5)


def outbox_row() -> dict[str, object]:
    now = dt.datetime.now(dt.UTC)
    return {
        "id": uuid.uuid4(),
        "type": "t",
        "exchange": "",
        "routing_key": "q",
        "content_type": "application/json",
        "headers": "{}",
        "body": b"{}",
        "created_at": now,
        "available_at": now,
    }


def test_the_migrated_outbox_notifies_on_commit(pg_db: Database) -> None:
    metadata.drop_all(pg_db.engine)
    command.upgrade(config_for(pg_db.url), "head")
    payloads = notified_on_commit(
        pg_db.engine, current_schema(pg_db.engine), outbox_message.insert().values(**outbox_row())
    )
    [payload] = payloads
    assert payload.endswith(".outbox_message")


def test_an_outbox_made_by_create_all_notifies_too(pg_db: Database) -> None:
    table = outbox_table(MetaData(), "app_outbox")
    table.create(pg_db.engine)
    payloads = notified_on_commit(
        pg_db.engine, current_schema(pg_db.engine), table.insert().values(**outbox_row())
    )
    [payload] = payloads
    assert payload.endswith(".app_outbox")


def test_an_outbox_created_through_a_schema_translate_map_notifies_from_there(
    pg_db: Database, admin_engines: dict[str, Engine]
) -> None:
    other = f"alt_{uuid.uuid4().hex[:12]}"
    with admin_engines["postgresql"].connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {other}"))
    translated = pg_db.engine.execution_options(schema_translate_map={None: other})
    try:
        table = outbox_table(MetaData())
        table.create(translated)  # the search path's outbox_message already has its trigger
        payloads = notified_on_commit(translated, other, table.insert().values(**outbox_row()))
        assert payloads == [f"{other}.outbox_message"]
    finally:
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"DROP SCHEMA {other} CASCADE"))
