"""``inbox``: the operator's command. ``status``, ``show``, ``release`` read and change the
inbox's tables; ``migrate`` creates or upgrades them; ``dlq list|show|replay|purge`` work on
a worker's dead-letter queue; ``console`` serves the same in a browser (a subcommand the
console registers, :mod:`inbox.admin._subcommands`); ``cleanup`` is ``inbox-cleanup``.

Exit codes: 0 success (also when the reader of the output went away: ``inbox status | head
-1``); 1 a database or broker error; 2 bad usage (or ``release``, ``dlq purge`` without
``--yes`` and no terminal to ask on: ``dlq purge --archive`` archives instead, and asks
nothing); 3 nothing found (``show``, ``release``, ``dlq show``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final, TextIO

from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from inbox._amqp.connections import BROKER_URL_ENV, broker_connection
from inbox._cli import (
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    OutputClosed,
    UsageError,
    VersionRequested,
    database_url,
    first_line,
    mask_urls,
    pipe_safe,
    quiet_closed_stdout,
    unmigrated,
    usage_line,
)
from inbox._oneline import database_error_line
from inbox.admin import _commands
from inbox.admin._audit import check_audit_file
from inbox.admin._dlq_commands import archive_named, dlq, dlq_archive
from inbox.admin._guard import guarded_cleanup
from inbox.admin._parser import usage_parser
from inbox.errors import ConfigurationError
from inbox.operations._migrate import migrate
from inbox.operations._tables import Tables

__all__ = ["admin_main"]


EXIT_BROKER_ERROR: Final = EXIT_DATABASE_ERROR
EXIT_NOT_FOUND: Final = _commands.EXIT_NOT_FOUND


def admin_main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    confirm: Callable[[str], bool] | None = None,
) -> int:
    """Run ``inbox``; see the module docstring for the exit codes. ``confirm`` asks a yes/no
    question (default: the terminal; without one, ``release`` needs ``--yes``)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    out = pipe_safe(sys.stdout if stdout is None else stdout)
    if arguments[:1] == ["cleanup"]:
        return _output_guarded(
            lambda: guarded_cleanup(arguments[1:], out, stderr or sys.stderr), out
        )
    io = _commands.Streams(
        out,
        sys.stderr if stderr is None else stderr,
        confirm if confirm is not None else _commands.terminal_confirm(),
    )
    parser = usage_parser()
    try:
        args = parser.parse_args(arguments)
        if hasattr(args, "audit_file"):  # a command that changes something: audited
            check_audit_file(args)
        broker = _broker_url(args)
        if args.command == "dlq" and _archives(args):
            assert broker is not None
            archive_url = database_url(args.database_url)
            archive = archive_named(args.archive_table)
            archive_engine, archive_broker = _engine(archive_url), broker

            def archived() -> int:
                try:
                    return dlq_archive(args, archive_broker, archive_engine, archive, io)
                finally:
                    archive_engine.dispose()

            return _guarded(archived, io, archive_url, broker)
        if args.command == "dlq":
            assert broker is not None
            dlq_broker = broker
            return _guarded(lambda: dlq(args, dlq_broker, io), io, None, broker)
        url = database_url(args.database_url)
        if args.command == "migrate":
            engine = _engine(url)
            return _guarded(lambda: _migrate(engine, url, args.revision, io), io, url, None)
        if getattr(args, "schemas", None) or getattr(args, "all_schemas", False):
            _commands.check_per_schema(args)
        tables = Tables.named(args.table, args.effect_table, args.outbox_table)
        engine = _engine(url)
    except VersionRequested as version:
        line = version.line
        return _output_guarded(lambda: _print(io, line), io.out)
    except (UsageError, ValueError) as exc:
        io.err.write(usage_line("inbox", exc))
        return EXIT_USAGE

    def run() -> int:
        try:
            command: _commands.Command = args.run  # set by the parser, for each subcommand
            return command(engine, tables, args, broker, io)
        finally:
            engine.dispose()

    return _guarded(run, io, url, broker)


def _archives(args: argparse.Namespace) -> bool:
    """Whether the ``dlq`` command moves dead letters into the archive: ``inbox dlq
    archive``, or ``inbox dlq purge --archive``."""
    if args.dlq_command == "archive":
        return True
    return args.dlq_command == "purge" and bool(args.archive)


def _print(io: _commands.Streams, line: str) -> int:
    io.out.write(f"{line}\n")
    return EXIT_OK


def _migrate(engine: Engine, url: URL, revision: str, io: _commands.Streams) -> int:
    try:
        io.out.writelines(f"{line}\n" for line in migrate(engine, url, revision))
    finally:
        engine.dispose()
    return EXIT_OK


def _output_guarded(run: Callable[[], int], out: TextIO) -> int:
    """``run()``, then its output flushed; a reader that went away (``| head -1``) ends the
    command quietly with exit 0: there is no one left to tell anything."""
    try:
        code = run()
        out.flush()
    except OutputClosed:
        quiet_closed_stdout()
        return EXIT_OK
    return code


def _guarded(
    run: Callable[[], int], io: _commands.Streams, url: URL | None, broker: str | None
) -> int:
    """``run()``, its errors printed as one line with the exit code they mean."""
    try:
        code = run()
        io.out.flush()
        return code
    except OutputClosed:
        quiet_closed_stdout()
        return EXIT_OK
    except UsageError as exc:  # found out on the database (a history of the application's)
        io.err.write(f"inbox: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        io.err.write("inbox: interrupted; what was not done yet is left as it was\n")
        return EXIT_BROKER_ERROR
    except ValueError as exc:  # found out only on connecting (a broker that is not RabbitMQ)
        io.err.write(f"inbox: error: {mask_urls(str(exc))}\n")
        return EXIT_USAGE
    except Exception as exc:  # the CLI edge: one line, never a traceback
        if url is not None and (broker is None or isinstance(exc, SQLAlchemyError)):
            io.err.write(f"inbox: error: {_database_line(exc, url)}\n")
            return EXIT_DATABASE_ERROR
        io.err.write(
            f"inbox: error: broker {mask_urls(str(broker))}: {mask_urls(first_line(exc))}\n"
        )
        return EXIT_BROKER_ERROR


def _database_line(exc: BaseException, url: URL) -> str:
    """A database error as one line; a missing inbox table says which migrations to run."""
    missing = unmigrated(exc)
    return missing if missing is not None else database_error_line(exc, url)


def _engine(url: URL) -> Engine:
    """An engine that keeps bound parameters (row data) out of its error messages."""
    try:
        return create_engine(url, hide_parameters=True)
    except ArgumentError as exc:  # an unknown dialect or driver
        raise ConfigurationError(f"--database-url: {first_line(exc)}") from None


def _broker_url(args: argparse.Namespace) -> str | None:
    """The broker URL a command needs (``dlq``, ``status --queue``), else None."""
    if args.command != "dlq" and not getattr(args, "queues", None):
        return None
    url: str | None = args.broker or os.environ.get(BROKER_URL_ENV)
    if not url:
        raise UsageError(f"no broker: pass --broker or set {BROKER_URL_ENV}")
    broker_connection(url)  # a ValueError that never echoes the URL when it does not parse
    return url
