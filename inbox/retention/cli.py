"""``inbox-cleanup``: parse the arguments, run :func:`inbox.cleanup` (creating partitions
ahead first on a partitioned table), print one line, return the exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from sqlalchemy import create_engine

from inbox._cli import (
    DATABASE_URL_ENV,
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UsageParser,
    VersionRequested,
    add_version,
    database_error_line,
    database_url,
    mask_urls,
    whole_number,
)
from inbox.retention._catalog import is_partitioned
from inbox.retention._create import ensure_partitions
from inbox.retention._layout import DEFAULT_DAYS_AHEAD
from inbox.retention._purge import MAX_BATCH_SIZE, CleanupReport, cleanup, cutoff_for
from inbox.schema import DEFAULT_TABLE_NAME, resolve_table

__all__ = ["cleanup_main"]


def _cleanup_parser() -> UsageParser:
    parser = UsageParser(
        prog="inbox-cleanup",
        description=(
            "Delete inbox claims processed more than --days days ago, in short batches that "
            "can run beside live workers. The window must exceed the longest time a message "
            "can be redelivered: a deleted claim no longer deduplicates."
        ),
    )
    parser.add_argument(
        "--days", type=whole_number(1), required=True, help="retention window in whole days (>= 1)"
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help=f"SQLAlchemy database URL (default: ${DATABASE_URL_ENV})",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, MAX_BATCH_SIZE),
        default=10_000,
        help="rows deleted per transaction (default: 10000)",
    )
    parser.add_argument(
        "--table", default=DEFAULT_TABLE_NAME, help="inbox table, NAME or SCHEMA.NAME"
    )
    parser.add_argument(
        "--partitions-ahead",
        type=whole_number(0, 3650),
        default=DEFAULT_DAYS_AHEAD,
        metavar="DAYS",
        help=(
            "on a table partitioned by inbox.partitioning (PostgreSQL): first create day "
            f"partitions until DAYS days ahead (default: {DEFAULT_DAYS_AHEAD})"
        ),
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="count the expired claims, delete (and create) nothing",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing on success (for cron)"
    )
    add_version(parser)
    return parser


def cleanup_main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``inbox-cleanup``; return 0 on success, 1 on a database error, 2 on bad usage."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    parser = _cleanup_parser()
    try:
        args = parser.parse_args(argv)
        cutoff_for(args.days)
        table = resolve_table(args.table)
        url = database_url(args.database_url)
    except VersionRequested as version:
        out.write(f"{version.line}\n")
        return EXIT_OK
    except (UsageError, ValueError) as exc:
        err.write(parser.format_usage())
        err.write(f"inbox-cleanup: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    created: list[str] = []
    try:
        engine = create_engine(url, hide_parameters=True)
        try:
            if not args.dry_run and is_partitioned(engine, table):
                created = ensure_partitions(engine, table, days_ahead=args.partitions_ahead)
            report = cleanup(
                engine,
                days=args.days,
                batch_size=args.batch_size,
                dry_run=args.dry_run,
                table=table,
            )
        finally:
            engine.dispose()
    except Exception as exc:  # the CLI edge: one line, never a traceback
        err.write(f"inbox-cleanup: error: {database_error_line(exc, url)}\n")
        return EXIT_DATABASE_ERROR
    if not args.quiet:
        out.write(_summary(report, table.fullname, created))
    return EXIT_OK


def _summary(report: CleanupReport, table: str, created: list[str]) -> str:
    verb = "would delete" if report.dry_run else "deleted"
    line = (
        f"inbox-cleanup: {verb} {report.deleted} claims processed before "
        f"{report.cutoff.isoformat(timespec='seconds')} from {table} "
        f"in {report.batches} batches"
    )
    if not report.dry_run:
        line += f" (longest {report.longest_batch_seconds * 1000:.0f} ms)"
    if report.effects_deleted:
        line += f", and {report.effects_deleted} effect records of those claims"
    if report.partitions_dropped or created:
        line += f", {len(report.partitions_dropped)} partitions dropped, {len(created)} created"
    return f"{line}, {report.seconds:.2f} s\n"
