"""Cleanup of effect records: a record goes only once the committed claim it belongs to is
past retention (and before that claim); a record whose claim never committed stays."""

from __future__ import annotations

import datetime as dt
import io
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import order
from support.ledger import Provider

from inbox import CleanupReport, HandlerFailed, Inbox, Message, Outcome, cleanup
from inbox.core.effects._identity import effect_key
from inbox.partitioning import create_partitioned_table
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_effect, inbox_message

NOW = dt.datetime(2026, 6, 1, 12, tzinfo=dt.UTC)
OLD = NOW - dt.timedelta(days=40)
YOUNG = NOW - dt.timedelta(days=2)


def claim(engine: Engine, key: bytes, handler: str, at: dt.datetime) -> None:
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_message).values(message_id=key, handler=handler, processed_at=at)
        )


def record(engine: Engine, key: bytes, handler: str, step: str, at: dt.datetime) -> uuid.UUID:
    ident = effect_key(key, handler, step)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_effect).values(
                effect_key=ident,
                claim_key=key,
                handler=handler,
                step=step,
                status="done",
                attempts=1,
                result="{}",
                started_at=at,
                updated_at=at,
            )
        )
    return ident


def kept(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as connection:
        return set(connection.execute(select(inbox_effect.c.effect_key)).scalars())


def test_an_effect_record_goes_only_with_its_expired_committed_claim(db: Database) -> None:
    engine = db.engine
    old, young, never, other = (os.urandom(16) for _ in range(4))
    claim(engine, old, "sms.send", OLD)
    claim(engine, young, "sms.send", YOUNG)
    claim(engine, other, "billing.charge", OLD)  # same key, another handler's claim
    expired = record(engine, old, "sms.send", "provider.send", OLD)
    expired_too = record(engine, old, "sms.send", "provider.receipt", OLD)
    young_one = record(engine, young, "sms.send", "provider.send", YOUNG)
    uncommitted = record(engine, never, "sms.send", "provider.send", OLD - dt.timedelta(days=300))
    other_handler = record(engine, other, "sms.send", "provider.send", OLD)

    dry = cleanup(engine, days=30, now=NOW, dry_run=True)
    assert (dry.deleted, dry.effects_deleted) == (2, 2)
    report = cleanup(engine, days=30, now=NOW, batch_size=1)
    assert isinstance(report, CleanupReport)
    assert (report.deleted, report.effects_deleted) == (2, 2)
    assert not {expired, expired_too} & kept(engine)
    assert kept(engine) == {young_one, uncommitted, other_handler}


def test_cleanup_works_on_a_database_without_the_effect_table(db: Database) -> None:
    inbox_effect.drop(db.engine)
    claim(db.engine, os.urandom(16), "sms.send", OLD)
    assert cleanup(db.engine, days=30, now=NOW).deleted == 1
    assert cleanup(db.engine, days=30, now=NOW, effect_table=None).deleted == 0


def test_inbox_cleanup_says_how_many_effect_records_went(db: Database, tmp_path: Path) -> None:
    key = os.urandom(16)
    claim(db.engine, key, "sms.send", dt.datetime.now(dt.UTC) - dt.timedelta(days=40))
    record(db.engine, key, "sms.send", "provider.send", OLD)
    out = io.StringIO()
    assert cleanup_main(["--database-url", db.url, "--days", "30"], stdout=out) == 0
    assert "deleted 1 claims" in out.getvalue()
    assert "and 1 effect records of those claims" in out.getvalue()
    assert kept(db.engine) == set()


def test_a_redelivery_never_calls_again_while_its_claim_deduplicates(server_db: Database) -> None:
    """Through the inbox: cleanup with a window that keeps the claim keeps the record, a
    redelivery is a duplicate; an undecided (failing) effect stays through any window."""
    inbox = Inbox(server_db.sessions)
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)
        if message.body["ref"] == "failing":
            raise RuntimeError("still failing")

    done, failing = order("done", "sms.requested"), order("failing", "sms.requested")
    assert inbox.process(done).outcome is Outcome.PROCESSED
    with pytest.raises(HandlerFailed):
        inbox.process(failing)
    now = dt.datetime.now(dt.UTC)
    assert cleanup(server_db.engine, days=1, now=now).effects_deleted == 0
    assert inbox.process(done).outcome is Outcome.DUPLICATE
    assert len(kept(server_db.engine)) == 2
    later = cleanup(server_db.engine, days=1, now=now + dt.timedelta(days=3))
    assert (later.deleted, later.effects_deleted) == (1, 1)
    [left] = kept(server_db.engine)
    assert left == effect_key(failing.id.bytes, "sms.send", "provider.send")
    assert len(provider.calls) == 2


def uuid7_at(moment: dt.datetime) -> uuid.UUID:
    milliseconds = (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    raw = bytearray(milliseconds.to_bytes(6, "big") + os.urandom(10))
    raw[6] = 0x70 | (raw[6] & 0x0F)
    raw[8] = 0x80 | (raw[8] & 0x3F)
    return uuid.UUID(bytes=bytes(raw))


def test_a_dropped_partitions_claims_take_their_effect_records_first(pg_db: Database) -> None:
    today = dt.datetime.now(dt.UTC).date()
    with pg_db.engine.begin() as connection:
        inbox_message.drop(connection)
        create_partitioned_table(connection, start=today - dt.timedelta(days=45), days_ahead=3)
    old_moment = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    old_key = uuid7_at(old_moment).bytes
    claim(pg_db.engine, old_key, "sms.send", old_moment)
    gone = record(pg_db.engine, old_key, "sms.send", "provider.send", old_moment)
    stays = record(pg_db.engine, uuid7_at(old_moment).bytes, "sms.send", "provider.send", OLD)

    report = cleanup(pg_db.engine, days=30)
    assert report.partitions_dropped, report
    assert (report.deleted, report.effects_deleted) == (1, 1)
    assert kept(pg_db.engine) == {stays}
    assert gone != stays
