"""Revision 8f4c3b5d0e6a on a database whose ``inbox_task_result`` already exists: earlier
docs said to make it with ``result_metadata.create_all(engine)``, so ``inbox migrate`` must
adopt that table (rows kept, missing index added) instead of stopping at "already exists";
and ``inbox.celery.result_metadata`` holds that one table, so an autogenerate aimed at it
sees nothing of the claims, outbox or effect tables."""

from __future__ import annotations

import datetime as dt
import io
import os

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import MetaData, inspect, select
from support.databases import Database, effects_metadata
from test_migrations_chain import ARCHIVE, EFFECTS, config_for, schema_diff, version

from inbox.admin import admin_main
from inbox.celery import result_metadata, task_result_table
from inbox.schema import inbox_task_result, metadata

STORED = dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC)


def at_effects_revision(db: Database) -> None:
    """A database migrated up to the revision before the result table."""
    metadata.drop_all(db.engine)
    effects_metadata.drop_all(db.engine)
    command.upgrade(config_for(db.url), EFFECTS)


def made_by_old_create_all(db: Database) -> bytes:
    """``inbox_task_result`` as the earlier ``result_metadata.create_all`` made it (the same
    columns and key, no ``stored_at`` index), holding one stored value; returns its key."""
    old = inbox_task_result.to_metadata(MetaData())
    old.indexes.clear()
    old.create(db.engine)
    key = os.urandom(16)
    with db.engine.begin() as connection:
        connection.execute(
            old.insert().values(claim_key=key, task="shop.charge", result="41", stored_at=STORED)
        )
    return key


def migrate(url: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(["migrate", "--database-url", url], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_inbox_migrate_adopts_a_result_table_made_by_create_all(db: Database) -> None:
    at_effects_revision(db)
    key = made_by_old_create_all(db)

    code, out, err = migrate(db.url)

    assert (code, err) == (0, ""), out
    assert version(db.engine) == ARCHIVE
    names = {index["name"] for index in inspect(db.engine).get_indexes("inbox_task_result")}
    assert "ix_inbox_task_result_stored_at" in names
    assert schema_diff(db.engine) == [], "autogenerate stays clean"
    with db.engine.connect() as connection:
        rows = connection.execute(select(inbox_task_result.c.claim_key, inbox_task_result.c.result))
        assert [(row.claim_key.bytes, row.result) for row in rows] == [(key, "41")]


def test_alembic_upgrade_head_over_todays_create_all_and_down_again(db: Database) -> None:
    at_effects_revision(db)
    result_metadata.create_all(db.engine)  # the table with its index, as create_all makes it now
    config = config_for(db.url)

    command.upgrade(config, "head")
    assert version(db.engine) == ARCHIVE
    assert schema_diff(db.engine) == []

    command.downgrade(config, EFFECTS)
    assert not inspect(db.engine).has_table("inbox_task_result")
    command.upgrade(config, "head")
    assert schema_diff(db.engine) == []


def test_result_metadata_holds_the_result_table_only(db: Database) -> None:
    assert list(result_metadata.tables) == ["inbox_task_result"]
    assert task_result_table.metadata is result_metadata
    at_effects_revision(db)
    command.upgrade(config_for(db.url), "head")
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, result_metadata)
    # Aimed at result_metadata alone, autogenerate finds the result table as it should be
    # and every other table of the database foreign to it (none of them is in it).
    kinds = {
        (change[0], change[1].table.name if change[0] == "remove_index" else change[1].name)
        for change in diff
    }
    assert {kind for kind, _ in kinds} <= {"remove_table", "remove_index"}, diff
    foreign = {name for _, name in kinds}
    assert foreign >= {"inbox_message", "outbox_message", "inbox_effect"}
    assert "inbox_task_result" not in foreign
