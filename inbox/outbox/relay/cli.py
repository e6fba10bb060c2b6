"""``inbox-relay``: send the rows of an outbox table to the broker (:class:`Relay`), or print
the table's status (``--status``).

Exit codes: 0 after a clean stop (SIGTERM or SIGINT: the batch in flight is confirmed and
deleted first) or a printed status; 1 when the database or the broker cannot be reached at
start, the table is missing, or the relay fails; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from sqlalchemy import URL, Table, create_engine

from inbox._amqp.connections import BROKER_URL_ENV, broker_connection, safe_uri
from inbox._cli import (
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UsageParser,
    VersionRequested,
    add_version,
    database_url,
    first_line,
    usage_line,
    whole_number,
)
from inbox._cli.logs import LOG_FORMATS, configure_logging
from inbox._cli.signals import install_signal_handlers
from inbox._oneline import database_error_line
from inbox.core._startup import SchemaNotReady
from inbox.errors import ConfigurationError
from inbox.outbox.relay._relay import MAX_RELAY_BATCH_SIZE, Relay, outbox_status
from inbox.outbox.relay._rows import resolve_outbox_table
from inbox.schema import DEFAULT_OUTBOX_TABLE_NAME

__all__ = ["relay_main"]


def _relay_parser() -> UsageParser:
    parser = UsageParser(
        prog="inbox-relay",
        description=(
            "Send every committed row of an outbox table to the broker (persistent, "
            "mandatory, confirmed, under the row's id), then delete it; a row the broker "
            "refuses stays with its error and is tried again later."
        ),
    )
    parser.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: $INBOX_DATABASE_URL)"
    )
    parser.add_argument(
        "--broker", default=None, help=f"AMQP broker URL (default: ${BROKER_URL_ENV})"
    )
    parser.add_argument(
        "--table",
        default=DEFAULT_OUTBOX_TABLE_NAME,
        help="the outbox table, NAME or SCHEMA.NAME (default outbox_message)",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, MAX_RELAY_BATCH_SIZE),
        default=100,
        help="rows published and confirmed together (default 100)",
    )
    parser.add_argument(
        "--poll-interval",
        type=_seconds,
        default=1.0,
        help="seconds between looks at an idle table (PostgreSQL wakes sooner on NOTIFY)",
    )
    parser.add_argument(
        "--max-retry-delay",
        type=_seconds,
        default=300.0,
        help="longest wait, in seconds, before a refused row is tried again (default 300)",
    )
    parser.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="poll only, even on PostgreSQL",
    )
    parser.add_argument(
        "--stats-interval", type=whole_number(1), default=60, help="seconds between stats lines"
    )
    parser.add_argument(
        "--connect-retries",
        type=whole_number(0),
        default=3,
        help="connection retries at start before giving up (later losses retry for ever)",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print the table's pending and refused rows on one line and exit (no broker)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default="text", help="one line per record"
    )
    add_version(parser)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def relay_main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``inbox-relay``; see the module docstring for the exit codes."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    parser = _relay_parser()
    try:
        args = parser.parse_args(argv)
        url = database_url(args.database_url)
        table = resolve_outbox_table(args.table)
        if args.status:
            return _status(url, table, out, err)
        broker = args.broker or os.environ.get(BROKER_URL_ENV)
        if not broker:
            raise ConfigurationError(f"no broker: pass --broker or set {BROKER_URL_ENV}")
        connection = broker_connection(broker)
        relay = Relay(
            create_engine(url, pool_pre_ping=True),
            connection,
            table=table,
            batch_size=args.batch_size,
            poll_interval=args.poll_interval,
            max_retry_delay=args.max_retry_delay,
            listen=args.listen,
            stats_interval=args.stats_interval,
        )
    except VersionRequested as version:
        out.write(f"{version.line}\n")
        return EXIT_OK
    except (UsageError, ValueError, TypeError, ImportError) as exc:
        err.write(usage_line("inbox-relay", exc))
        return EXIT_USAGE
    configure_logging(args.log_level, False, err, args.log_format)
    try:
        return _run(relay, args.connect_retries, err)
    finally:
        relay.close()
        relay.engine.dispose()


def _run(relay: Relay, retries: int, err: TextIO) -> int:
    where = safe_uri(relay.connection)
    install_signal_handlers(relay)  # a stop while connecting is a clean stop too
    try:
        relay.prepare(max_retries=retries)
    except KeyboardInterrupt:
        err.write("inbox-relay: interrupted while connecting\n")
        return EXIT_DATABASE_ERROR
    except SchemaNotReady as exc:
        err.write(f"inbox-relay: error: {exc}\n")
        return EXIT_DATABASE_ERROR
    except Exception as exc:  # the CLI edge: one line, never a traceback
        line = (
            database_error_line(exc, relay.engine.url)
            if hasattr(exc, "orig")
            else f"broker {where}: {first_line(exc)}"
        )
        err.write(f"inbox-relay: error: {line}\n")
        return EXIT_DATABASE_ERROR
    try:
        relay.run()
    except KeyboardInterrupt:
        err.write("inbox-relay: stopped at once; the batch in flight will be sent again\n")
        return EXIT_DATABASE_ERROR
    except Exception as exc:
        err.write(f"inbox-relay: error: {first_line(exc)}\n")
        return EXIT_DATABASE_ERROR
    return EXIT_OK


def _status(url: URL, table: Table, out: TextIO, err: TextIO) -> int:
    engine = create_engine(url)
    try:
        out.write(outbox_status(engine, table).line() + "\n")
    except Exception as exc:
        err.write(f"inbox-relay: error: {database_error_line(exc, url)}\n")
        return EXIT_DATABASE_ERROR
    finally:
        engine.dispose()
    return EXIT_OK
