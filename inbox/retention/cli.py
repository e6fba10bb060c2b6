"""``inbox-cleanup``: parse the arguments, run :func:`inbox.cleanup` (creating partitions
ahead first on a partitioned table), print one line, return the exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from sqlalchemy import URL, MetaData, create_engine

from inbox._cli import (
    DATABASE_URL_ENV,
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    OutputClosed,
    UsageError,
    UsageParser,
    VersionRequested,
    add_version,
    database_url,
    pipe_safe,
    printable_url,
    quiet_closed_stdout,
    unmigrated,
    usage_line,
    whole_number,
)
from inbox._oneline import database_error_line
from inbox.partitioning._catalog import is_partitioned
from inbox.partitioning._create import ensure_partitions
from inbox.partitioning._layout import DEFAULT_DAYS_AHEAD
from inbox.retention._archive_retention import expire_archive
from inbox.retention._purge import (
    DEFAULT_BATCH_SECONDS,
    MAX_BATCH_SECONDS,
    MAX_CLEANUP_BATCH_SIZE,
    MAX_PAUSE_RATIO,
    CleanupReport,
    cleanup,
    cutoff_for,
)
from inbox.retention._targets import targets_for
from inbox.schema import (
    DEFAULT_ARCHIVE_TABLE_NAME,
    DEFAULT_TABLE_NAME,
    archive_table,
    resolve_table,
)

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
        action="append",
        default=None,
        help=f"SQLAlchemy database URL, repeatable (default: ${DATABASE_URL_ENV})",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, MAX_CLEANUP_BATCH_SIZE),
        default=None,
        help="rows deleted per transaction (default: as many as take --batch-ms)",
    )
    parser.add_argument(
        "--batch-ms",
        type=whole_number(1, int(MAX_BATCH_SECONDS * 1000)),
        default=round(DEFAULT_BATCH_SECONDS * 1000),
        metavar="MS",
        help=(
            "without --batch-size: size each batch to take about MS milliseconds, from the "
            f"rate of the previous ones (default: {round(DEFAULT_BATCH_SECONDS * 1000)})"
        ),
    )
    parser.add_argument(
        "--pause-ms",
        type=whole_number(0, int(MAX_BATCH_SECONDS * 1000)),
        default=0,
        metavar="MS",
        help="sleep MS milliseconds between two batches, leaving the database to the workers "
        "(default: 0)",
    )
    parser.add_argument(
        "--pause-percent",
        type=whole_number(0, round(MAX_PAUSE_RATIO * 100)),
        default=0,
        metavar="P",
        help="after each batch, sleep P%% of the time it took (200: twice as long), so the "
        "pauses grow when a loaded server slows the batches; the longer of this and "
        "--pause-ms (default: 0)",
    )
    parser.add_argument(
        "--table", default=DEFAULT_TABLE_NAME, help="inbox table, NAME or SCHEMA.NAME"
    )
    tenants = parser.add_mutually_exclusive_group()
    tenants.add_argument(
        "--schema",
        action="append",
        default=[],
        help="clean the table NAME in this schema (repeatable: one per tenant)",
    )
    tenants.add_argument(
        "--all-schemas",
        action="store_true",
        help="clean the table NAME in every schema holding it (PostgreSQL; MariaDB: databases)",
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
        "--archive-days",
        type=whole_number(1),
        default=None,
        metavar="DAYS",
        help="also delete the dead letters archived more than DAYS days ago "
        "(inbox_dead_letter_archive, in each schema cleaned; default: keep them)",
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
    out = pipe_safe(sys.stdout if stdout is None else stdout)
    err = sys.stderr if stderr is None else stderr
    parser = _cleanup_parser()
    try:
        args = parser.parse_args(argv)
        cutoff_for(args.days)
        table = resolve_table(args.table)
        if table.schema and (args.schema or args.all_schemas):
            raise UsageError("--schema and --all-schemas take --table as a NAME, not SCHEMA.NAME")
        for schema in args.schema:
            resolve_table(f"{schema}.{table.name}")  # a plain identifier, else ValueError
        urls = [database_url(given) for given in args.database_url or [None]]
    except VersionRequested as version:
        _written(out, [f"{version.line}\n"], EXIT_OK)
        return EXIT_OK
    except (UsageError, ValueError) as exc:
        err.write(usage_line("inbox-cleanup", exc))
        return EXIT_USAGE
    failed = False
    for url in urls:
        where = f" on {printable_url(url)}" if len(urls) > 1 else ""
        try:
            lines = _clean_database(url, where, args)
        except Exception as exc:  # the CLI edge: one line, never a traceback
            line = unmigrated(exc) or database_error_line(exc, url)
            err.write(f"inbox-cleanup: error: {line}{where}\n")
            failed = True
            continue
        if not args.quiet and _written(out, lines, EXIT_OK) is None:
            return EXIT_OK  # the reader went away (| head -1): no one to tell the rest
    return EXIT_DATABASE_ERROR if failed else EXIT_OK


def _written(out: TextIO, lines: list[str], code: int) -> int | None:
    """``code`` once ``lines`` are written and flushed; None (and standard output quieted)
    when the reader of the output has gone away."""
    try:
        out.writelines(lines)
        out.flush()
    except OutputClosed:
        quiet_closed_stdout()
        return None
    return code


def _clean_database(url: URL, where: str, args: argparse.Namespace) -> list[str]:
    """Clean every target table of one database; one summary line per table."""
    lines = []
    engine = create_engine(url, hide_parameters=True)
    try:
        for target in targets_for(engine, args.table, args.schema, args.all_schemas):
            created: list[str] = []
            if not args.dry_run and is_partitioned(engine, target.table):
                created = ensure_partitions(engine, target.table, days_ahead=args.partitions_ahead)
            report = cleanup(
                engine,
                days=args.days,
                batch_size=args.batch_size,
                batch_seconds=args.batch_ms / 1000,
                pause_seconds=args.pause_ms / 1000,
                pause_ratio=args.pause_percent / 100,
                dry_run=args.dry_run,
                table=target.table,
                effect_table=target.effect_table,
                result_table=target.result_table,
            )
            lines.append(_summary(report, target.table.fullname + where, created))
            if args.archive_days is not None:
                archive = archive_table(
                    MetaData(), DEFAULT_ARCHIVE_TABLE_NAME, schema=target.table.schema
                )
                expired = expire_archive(engine, archive, args.archive_days, dry_run=args.dry_run)
                if expired is not None:
                    verb = "would delete" if args.dry_run else "deleted"
                    lines.append(
                        f"inbox-cleanup: {verb} {expired} dead letters archived more than "
                        f"{args.archive_days} days ago from {archive.fullname}{where}\n"
                    )
    finally:
        engine.dispose()
    return lines


def _summary(report: CleanupReport, table: str, created: list[str]) -> str:
    cutoff = report.cutoff.isoformat(timespec="seconds")
    if report.dry_run:
        line = (
            f"inbox-cleanup: dry run: would delete {report.deleted} claims processed before "
            f"{cutoff} from {table}"
        )
    else:
        line = (
            f"inbox-cleanup: deleted {report.deleted} claims processed before {cutoff} from "
            f"{table} in {report.batches} batches (longest "
            f"{report.longest_batch_seconds * 1000:.0f} ms)"
        )
    if report.effects_deleted:
        verb = "would delete" if report.dry_run else "and"
        line += f", {verb} {report.effects_deleted} effect records of those claims"
    if report.results_deleted:
        verb = "would delete" if report.dry_run else "and"
        line += f", {verb} {report.results_deleted} stored task results"
    if report.partitions_dropped or created:
        line += f", {len(report.partitions_dropped)} partitions dropped, {len(created)} created"
    return f"{line}, {report.seconds:.2f} s\n"
