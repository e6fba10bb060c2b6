"""The retention guard of ``inbox cleanup --broker URL --queue Q``: a dead letter can still
be replayed, and its replay must find the claims of the handlers that already committed, or
they run again. So the window is widened to keep every claim younger than the oldest dead
letter of each queue (plus a day, for clocks that disagree)."""

from __future__ import annotations

import datetime as dt
import math
import os
from typing import Final, TextIO

from inbox._amqp.connections import BROKER_URL_ENV, broker_connection
from inbox._cli import (
    EXIT_DATABASE_ERROR,
    EXIT_USAGE,
    UsageError,
    UsageParser,
    first_line,
    mask_urls,
    whole_number,
)
from inbox.operations._dead_letter_age import oldest_dead_letter
from inbox.operations._dead_letters import open_channel
from inbox.retention.cli import cleanup_main

__all__ = ["guarded_cleanup", "guarded_days"]

_MARGIN: Final = dt.timedelta(days=1)


def guarded_cleanup(argv: list[str], out: TextIO, err: TextIO) -> int:
    """``inbox cleanup``: ``inbox-cleanup``, with the retention guard when given ``--queue``."""
    guard = UsageParser(prog="inbox cleanup", add_help=False)
    guard.add_argument("--broker")
    guard.add_argument("--queue", action="append", default=[])
    guard.add_argument("--days", type=whole_number(1))
    guard.add_argument("-q", "--quiet", action="store_true")
    try:
        known, rest = guard.parse_known_args(argv)
    except UsageError:
        known = None  # inbox-cleanup says what is wrong
    if known is None or not known.queue or known.days is None:
        return cleanup_main(argv, stdout=out, stderr=err)
    broker = known.broker or os.environ.get(BROKER_URL_ENV)
    if not broker:
        err.write(f"inbox: error: --queue needs a broker: pass --broker or set {BROKER_URL_ENV}\n")
        return EXIT_USAGE
    try:
        broker_connection(broker)  # a ValueError that never echoes the URL
        with open_channel(broker) as channel:
            found = [oldest_dead_letter(channel, queue) for queue in known.queue]
    except ValueError as exc:
        err.write(f"inbox: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    except Exception as exc:  # the CLI edge: one line, never a traceback
        err.write(f"inbox: error: broker {mask_urls(broker)}: {mask_urls(first_line(exc))}\n")
        return EXIT_DATABASE_ERROR  # 1, as for a database error
    oldest = min((o for o in found if o is not None), key=lambda o: o.at, default=None)
    days = guarded_days(known.days, oldest.at if oldest else None, dt.datetime.now(dt.UTC))
    if oldest is not None and days > known.days and not known.quiet:
        out.write(
            f"inbox cleanup: keeping the claims of the last {days} days, not {known.days}: the "
            f"oldest dead letter in {oldest.dead_letter_queue} (message {oldest.message_id}) was "
            f"first sent at {oldest.at.isoformat(timespec='seconds')} and may still be replayed\n"
        )
    return cleanup_main(
        [*rest, "--days", str(days), *(["--quiet"] if known.quiet else [])], stdout=out, stderr=err
    )


def guarded_days(days: int, oldest: dt.datetime | None, now: dt.datetime) -> int:
    """``days``, or more whole days so that claims processed since ``oldest`` (less a day's
    margin) are kept."""
    if oldest is None:
        return days
    needed = math.ceil((now - oldest + _MARGIN) / dt.timedelta(days=1))
    return max(days, needed)
