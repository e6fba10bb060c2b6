"""``inbox cleanup``: ``inbox-cleanup``, with the retention guard of
:mod:`inbox.operations._dead_letter_age` when given ``--broker URL --queue Q``: the window
widened to keep every claim younger than the oldest dead letter of each queue."""

from __future__ import annotations

import datetime as dt
import os
from typing import TextIO

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
from inbox.operations._dead_letter_age import guarded_days, oldest_of
from inbox.retention.cli import cleanup_main

__all__ = ["guarded_cleanup"]


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
        oldest = oldest_of(broker, known.queue)
    except ValueError as exc:
        err.write(f"inbox: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    except Exception as exc:  # the CLI edge: one line, never a traceback
        err.write(f"inbox: error: broker {mask_urls(broker)}: {mask_urls(first_line(exc))}\n")
        return EXIT_DATABASE_ERROR  # 1, as for a database error
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
