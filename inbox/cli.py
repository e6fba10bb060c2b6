"""Command-line adapters: parse arguments, call the library, print one line, return a code."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from sqlalchemy import URL, create_engine, make_url
from sqlalchemy.exc import ArgumentError

from inbox.partitioning import DEFAULT_DAYS_AHEAD, ensure_partitions, is_partitioned
from inbox.retention import MAX_BATCH_SIZE, CleanupReport, cleanup, cutoff_for
from inbox.schema import DEFAULT_TABLE_NAME, resolve_table

__all__ = ["EXIT_DATABASE_ERROR", "EXIT_OK", "EXIT_USAGE", "cleanup_main"]

EXIT_OK = 0
EXIT_DATABASE_ERROR = 1
EXIT_USAGE = 2
DATABASE_URL_ENV = "INBOX_DATABASE_URL"
_SECRET_QUERY_WORDS = ("password", "passwd", "pwd", "secret", "token", "key")


class UsageError(Exception):
    pass


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser that reports errors to its caller instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def whole_number(low: int, high: int | None = None) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse  # type: ignore[return-value]


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
        url = _database_url(args.database_url)
    except (UsageError, ValueError) as exc:
        err.write(parser.format_usage())
        err.write(f"inbox-cleanup: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    created: list[str] = []
    try:
        engine = create_engine(url)
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
        err.write(f"inbox-cleanup: error: {_one_line(exc, url)}\n")
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
    if report.partitions_dropped or created:
        line += f", {len(report.partitions_dropped)} partitions dropped, {len(created)} created"
    return f"{line}, {report.seconds:.2f} s\n"


def _database_url(given: str | None) -> URL:
    text = given if given is not None else os.environ.get(DATABASE_URL_ENV)
    if not text:
        raise ValueError(f"no database: pass --database-url or set {DATABASE_URL_ENV}")
    try:
        return make_url(text)
    except (ArgumentError, ValueError):  # never echo the parser's text: it may hold the password
        raise ValueError("--database-url is not a valid SQLAlchemy URL") from None


_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^\s:/@]*:)[^\s@]*@")


def mask_urls(text: str) -> str:
    """``text`` with the password of every URL in it masked (argparse echoes arguments it
    did not recognise, URLs given in the wrong place included)."""
    return _URL_CREDENTIALS.sub(r"\g<head>***@", text)


def _one_line(exc: BaseException, url: URL) -> str:
    """The first line of the error, with every secret of the URL masked wherever it appears."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    message = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    secrets = [str(url.password)] if url.password else []
    query = dict(url.query)
    for name, value in url.query.items():
        if any(word in name.lower() for word in _SECRET_QUERY_WORDS):
            values = [value] if isinstance(value, str) else list(value)
            secrets.extend(v for v in values if v)
            query[name] = "***"
    line = f"{message} (database {url.set(query=query).render_as_string(hide_password=True)})"
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "***")
    return line.replace("%2A%2A%2A", "***")
