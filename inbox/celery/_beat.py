"""Exactly-once periodic tasks: a beat entry whose claim is ``(scheduled slot, task name)``.

Beat computes the slot when it sends the task (a :class:`celery.beat.BeatLazyFunc` in the
entry's kwargs, which beat calls at send time): the time of the schedule's latest slot at
or before now. Two beats, or a beat restarted mid-tick, send the same slot and the inbox
claims it once. An interval's slots are multiples of it since 1970-01-01 UTC; a crontab's
are the times it names, in its time zone.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Final

from celery.beat import BeatLazyFunc
from celery.schedules import crontab, schedule

from inbox.errors import ConfigurationError

__all__ = ["SLOT", "beat_slot", "entry", "slot_at"]

SLOT: Final = "slot"
"""The keyword argument a beat entry's task receives its slot in (ISO 8601, UTC)."""

_YEARS_SEARCHED: Final = 28  # the Gregorian calendar's weekdays repeat within 28 years


def beat_slot(*_: Any, slot: str, **__: Any) -> str:
    """The ``key=`` of a task sent by :meth:`~inbox.celery.InboxTasks.beat_entry`: its
    scheduled slot, so the claim is ``(slot, task name)``."""
    return slot


def entry(
    app: Any, task: Any, every: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    """A ``beat_schedule`` entry for ``task`` whose kwargs carry the slot beat sends it for."""
    when = _schedule(app, every)
    given = dict(kwargs or {})
    if SLOT in given:
        raise ConfigurationError(
            f"beat entry for {task.name!r}: kwargs must not set {SLOT!r}, beat sets it"
        )
    given[SLOT] = BeatLazyFunc(_slot_now, when)
    return {"task": task.name, "schedule": when, "args": tuple(args), "kwargs": given}


def slot_at(when: Any, now: dt.datetime) -> str:
    """The slot of schedule ``when`` (a celery ``schedule`` or ``crontab``) that ``now``
    (aware) falls in: its latest time at or before ``now``, ISO 8601 in UTC."""
    if isinstance(when, crontab):
        start = _latest_cron_time(when, now)
    else:
        period = when.run_every.total_seconds()
        start = dt.datetime.fromtimestamp(math.floor(now.timestamp() / period) * period, dt.UTC)
    return start.astimezone(dt.UTC).isoformat()


def _slot_now(when: Any) -> str:
    return slot_at(when, when.maybe_make_aware(when.now()))


def _schedule(app: Any, every: Any) -> Any:
    if isinstance(every, crontab):
        every.app = app  # what beat does with an entry's schedule: the app's time zone
        return every
    if isinstance(every, schedule) and not every.relative:
        return schedule(every.run_every, app=app)
    if isinstance(every, dt.timedelta | int | float) and not isinstance(every, bool):
        seconds = every.total_seconds() if isinstance(every, dt.timedelta) else float(every)
        if seconds > 0:
            return schedule(dt.timedelta(seconds=seconds), app=app)
    raise ConfigurationError(
        "a beat entry's schedule is a crontab, an interval (seconds > 0 or a timedelta) or a "
        f"celery.schedules.schedule without relative=True; got {every!r}"
    )


def _latest_cron_time(cron: crontab, now: dt.datetime) -> dt.datetime:
    local = now.astimezone(cron.tz)
    zone = local.tzinfo
    for back in range(366 * _YEARS_SEARCHED):
        day = local.date() - dt.timedelta(days=back)
        if not (
            day.month in cron.month_of_year
            and day.day in cron.day_of_month
            and day.isoweekday() % 7 in cron.day_of_week
        ):
            continue
        for hour in sorted(cron.hour, reverse=True):
            for minute in sorted(cron.minute, reverse=True):
                at = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                if at <= local:
                    return at
    raise ConfigurationError(f"{cron!r} names no time in the {_YEARS_SEARCHED} years before now")
