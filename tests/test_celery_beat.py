"""Exactly-once beat entries: the slot is computed by beat when it sends, the claim is
(slot, task name). Two beats' schedulers send the same slot to a real prefork worker on
RabbitMQ (PostgreSQL): one run; the next slot runs again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab, schedule
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.rabbit import AMQP_URL, rabbit_area
from test_celery_worker import sender, until, worker

from inbox import Inbox
from inbox.celery import InboxTasks, beat_slot
from inbox.celery._beat import slot_at
from inbox.errors import ConfigurationError

UTC = dt.UTC


def test_two_beats_sending_the_same_slot_run_the_task_once_per_slot(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [dt.datetime(2026, 11, 28, 10, 0, 5, tzinfo=UTC)]
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        every_minute = crontab(minute="*", nowfun=lambda: now[0])
        app.app.conf.beat_schedule = {"tick": app.tasks.beat_entry(app.tick, every_minute)}
        beats = [Scheduler(app=app.app), Scheduler(app=app.app)]
        for beat, at in zip(beats, (5, 40), strict=True):  # two beats, one slot
            now[0] = now[0].replace(second=at)
            beat.apply_async(beat.schedule["tick"])
        now[0] = dt.datetime(2026, 11, 28, 10, 1, 2, tzinfo=UTC)  # a restarted beat, next slot
        restarted = Scheduler(app=app.app)
        restarted.apply_async(restarted.schedule["tick"])
        restarted.apply_async(restarted.schedule["tick"])
        with worker(AMQP_URL, area.queue("celery"), pg_db, tmp_path):
            until(lambda: area.depth(area.queue("celery")) == 0, "every send consumed")
            until(lambda: len(pg_db.effect_counts()) == 2, "both slots to run")
        assert pg_db.effect_counts() == {
            ("2026-11-28T10:00:00+00:00", "ct.tick"): 1,
            ("2026-11-28T10:01:00+00:00", "ct.tick"): 1,
        }


@pytest.fixture
def paris() -> Iterator[Celery]:
    app = Celery("celery_beat_test", set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    yield app
    app.close()


def at(*fields: int) -> dt.datetime:
    return dt.datetime(*fields, tzinfo=UTC)


def test_an_interval_slot_is_its_latest_multiple_since_the_epoch(paris: Celery) -> None:
    every = schedule(dt.timedelta(minutes=15), app=paris)
    assert slot_at(every, at(2026, 11, 28, 10, 29, 59)) == "2026-11-28T10:15:00+00:00"
    assert slot_at(every, at(2026, 11, 28, 10, 30)) == "2026-11-28T10:30:00+00:00"


def test_a_crontab_slot_is_its_latest_time_at_or_before_now_in_the_app_time_zone(
    paris: Celery,
) -> None:
    mondays = crontab(hour=3, minute=0, day_of_week="mon", app=paris)  # 03:00 Paris, UTC+1
    assert slot_at(mondays, at(2026, 11, 25, 12)) == "2026-11-23T02:00:00+00:00"  # a Wednesday
    assert slot_at(mondays, at(2026, 11, 23, 2)) == "2026-11-23T02:00:00+00:00"
    assert slot_at(mondays, at(2026, 11, 23, 1, 59)) == "2026-11-16T02:00:00+00:00"
    leap = crontab(hour=0, minute=30, day_of_month=29, month_of_year=2, app=paris)
    assert slot_at(leap, at(2026, 11, 28)) == "2024-02-28T23:30:00+00:00"


def test_a_beat_entry_refuses_a_task_without_the_slot_key_a_set_slot_and_a_bad_schedule(
    paris: Celery, db: Database
) -> None:
    tasks = InboxTasks(paris, Inbox(db.sessions), db.sessions)

    @tasks.task(name="b.tick", key=beat_slot)
    def tick(session: Session, slot: str) -> None:
        write(session, slot, "b.tick")

    @tasks.task(name="b.plain")
    def plain(session: Session, slot: str) -> None:
        write(session, slot, "b.plain")

    entry = tasks.beat_entry(tick, 60, kwargs={"n": 1})
    assert entry["task"] == "b.tick"
    assert entry["args"] == ()
    assert set(entry["kwargs"]) == {"n", "slot"}
    with pytest.raises(ConfigurationError, match=r"beat_entry\('b.plain'\).*key=inbox.celery"):
        tasks.beat_entry(plain, 60)
    with pytest.raises(ConfigurationError, match="kwargs must not set 'slot'"):
        tasks.beat_entry(tick, 60, kwargs={"slot": "x"})
    for bad in (0, -1, True, "60", schedule(60, relative=True)):
        with pytest.raises(ConfigurationError, match="a beat entry's schedule is a crontab"):
            tasks.beat_entry(tick, bad)


def write(session: Session, ref: str, handler: str) -> None:
    session.execute(effects.insert().values(ref=ref, handler=handler))
