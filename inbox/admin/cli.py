"""``inbox``: the operator's command. ``status``, ``show``, ``release`` read and change the
inbox's tables; ``migrate`` creates or upgrades them; ``dlq list|show|replay|purge`` work on
a worker's dead-letter queue; ``console`` serves the same in a browser; ``cleanup`` is
``inbox-cleanup``.

Exit codes: 0 success (also when the reader of the output went away: ``inbox status | head
-1``); 1 a database or broker error; 2 bad usage (or ``release``, ``dlq purge`` without
``--yes`` and no terminal to ask on); 3 nothing found (``show``, ``release``, ``dlq show``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final, TextIO

from sqlalchemy import URL, Engine, MetaData, Table, create_engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from inbox._amqp.connections import BROKER_URL_ENV, broker_connection
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
    first_line,
    mask_urls,
    pipe_safe,
    quiet_closed_stdout,
    unmigrated,
    usage_line,
    whole_number,
)
from inbox._oneline import database_error_line
from inbox.admin import _claims, _commands
from inbox.admin._dlq_commands import dead_letter_reason, dlq, duration
from inbox.admin._guard import guarded_cleanup
from inbox.admin._migrate import migrate
from inbox.errors import ConfigurationError
from inbox.schema import (
    DEFAULT_EFFECT_TABLE_NAME,
    DEFAULT_OUTBOX_TABLE_NAME,
    DEFAULT_TABLE_NAME,
    effect_table,
    outbox_table,
    resolve_table,
)

__all__ = ["admin_main"]

EXIT_BROKER_ERROR: Final = EXIT_DATABASE_ERROR
EXIT_NOT_FOUND: Final = _commands.EXIT_NOT_FOUND


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of ``inbox``, by command line (``"inbox"``, ``"inbox status"``,
    ``"inbox dlq replay"``...): what the CLI reference of the docs is generated from."""
    parsers: dict[str, argparse.ArgumentParser] = {}
    _parser(parsers)
    return parsers


def _parser(parsers: dict[str, argparse.ArgumentParser] | None = None) -> UsageParser:
    parser = UsageParser(
        prog="inbox",
        description="Look into and repair an inbox: claims, effects, outbox, dead letters.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)

    status = commands.add_parser("status", help="claims per handler, outbox, effects, dead letters")
    _database_options(status)
    status.add_argument("--broker", help=f"with --queue: dead letters (default ${BROKER_URL_ENV})")
    status.add_argument("--queue", dest="queues", action="append", default=[], help="repeat")
    status.add_argument("--json", action="store_true", help="one JSON document")
    tenants = status.add_mutually_exclusive_group()
    tenants.add_argument(
        "--schema", dest="schemas", action="append", default=[], help="a tenant schema; repeat"
    )
    tenants.add_argument(
        "--all-schemas", action="store_true", help="every schema holding the claims table"
    )

    show = commands.add_parser("show", help="which handlers processed a message, and when")
    _database_options(show)
    _key_options(show)
    show.add_argument("--handler", help="only this handler")
    show.add_argument("--json", action="store_true", help="one JSON document")

    release = commands.add_parser(
        "release", help="delete a handler's claim and effect records: the next delivery re-runs it"
    )
    _database_options(release)
    _key_options(release)
    release.add_argument("--handler", required=True, help="the handler to run again")
    release.add_argument("--yes", action="store_true", help="do not ask")

    upgrade = commands.add_parser(
        "migrate",
        help="create or upgrade the inbox's tables: the shipped revisions, from the package",
    )
    upgrade.add_argument("--database-url", help=f"SQLAlchemy URL (default ${DATABASE_URL_ENV})")
    upgrade.add_argument(
        "--revision", default="head", help="an inbox revision to upgrade to (default: head)"
    )

    dlq = commands.add_parser("dlq", help="a worker's dead-letter queue <QUEUE>.dlq")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=UsageParser)
    listing = dlq_commands.add_parser("list", help="the first dead letters, left in place")
    _broker_options(listing)
    listing.add_argument("--limit", type=whole_number(1, 10_000), default=20)
    listing.add_argument("--json", action="store_true", help="one JSON document")
    show_one = dlq_commands.add_parser("show", help="one dead letter in full, left in place")
    _broker_options(show_one)
    show_one.add_argument("message_id", metavar="MESSAGE-ID")
    show_one.add_argument("--max-body", type=whole_number(0), default=4096, help="bytes shown")
    replay = dlq_commands.add_parser(
        "replay", help="move the dead letters present now back to QUEUE, tries reset"
    )
    _move_options(replay)
    replay.add_argument(
        "--max-replays",
        type=whole_number(1),
        default=3,
        help="leave a message replayed N times already where it is (default 3)",
    )
    replay.add_argument(
        "--keep-tries",
        action="store_true",
        help="keep x-inbox-tries: one more failure dead-letters",
    )
    purge = dlq_commands.add_parser("purge", help="delete dead letters for good")
    _move_options(purge)
    purge.add_argument("--yes", action="store_true", help="do not ask")

    console = commands.add_parser(
        "console", help="the operator console in a browser (docs/console.md)"
    )
    _database_options(console)
    # The console is built on this package's operations; the command only reaches it here
    # and at its run, when asked (no import cycle, no web stack for the other commands).
    from inbox.console._command import add_options as console_options

    console_options(console)

    commands.add_parser(
        "cleanup",
        help=(
            "inbox-cleanup (see inbox cleanup --help); with --broker/--queue Q it keeps every "
            "claim younger than the oldest dead letter of Q"
        ),
        add_help=False,
    )
    if parsers is not None:
        parsers["inbox"] = parser
        parsers.update({f"inbox {name}": p for name, p in commands.choices.items()})
        parsers.update({f"inbox dlq {name}": p for name, p in dlq_commands.choices.items()})
    return parser


def _database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help=f"SQLAlchemy URL (default ${DATABASE_URL_ENV})")
    parser.add_argument("--table", default=DEFAULT_TABLE_NAME, help="claims table, [SCHEMA.]NAME")
    parser.add_argument("--effect-table", default=DEFAULT_EFFECT_TABLE_NAME, help="[SCHEMA.]NAME")
    parser.add_argument("--outbox-table", default=DEFAULT_OUTBOX_TABLE_NAME, help="[SCHEMA.]NAME")


def _key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id_or_key",
        metavar="ID-OR-KEY",
        help="a message id, or a business key as the producer wrote it",
    )
    parser.add_argument(
        "--key",
        action="store_true",
        help="ID-OR-KEY is a business key even if it looks like a UUID",
    )


def _move_options(parser: argparse.ArgumentParser) -> None:
    _broker_options(parser)
    parser.add_argument("--limit", type=whole_number(1), help="at most N dead letters")
    parser.add_argument(
        "--reason",
        action="append",
        default=[],
        type=dead_letter_reason,
        help="only this reason, as x-inbox-reason says it (handler-failed, ...; repeat)",
    )
    parser.add_argument("--handler", action="append", default=[], help="only if H failed (repeat)")
    parser.add_argument(
        "--id", dest="message_ids", action="append", default=[], help="only this message (repeat)"
    )
    parser.add_argument(
        "--older-than", type=duration, help="only dead-lettered at least this long ago (30m, 7d)"
    )
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no progress or summary")


def _broker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", help=f"RabbitMQ URL (default ${BROKER_URL_ENV})")
    parser.add_argument("--queue", required=True, help="the worker's queue (its .dlq is read)")


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
    parser = _parser()
    try:
        args = parser.parse_args(arguments)
        broker = _broker_url(args)
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
        tables = _commands.Tables(
            resolve_table(args.table),
            _named(args.effect_table, effect_table),
            _named(args.outbox_table, outbox_table),
        )
        keys = (
            _claims.lookup_keys(args.id_or_key, business_key=args.key)
            if args.command in ("show", "release")
            else ()
        )
        engine = _engine(url)
    except VersionRequested as version:
        line = version.line
        return _output_guarded(lambda: _print(io, line), io.out)
    except (UsageError, ValueError) as exc:
        io.err.write(usage_line("inbox", exc))
        return EXIT_USAGE

    def run() -> int:
        try:
            if args.command == "status" and (args.schemas or args.all_schemas):
                return _commands.status_per_schema(engine, tables, args, io)
            if args.command == "status":
                return _commands.status(engine, tables, args, broker, io)
            if args.command == "console":
                from inbox.console._command import run as run_console

                return run_console(engine, tables, args, broker, io)
            if args.command == "show":
                return _commands.show(engine, tables, keys, args, io)
            return _commands.release(engine, tables, keys, args, io)
        finally:
            engine.dispose()

    return _guarded(run, io, url, broker)


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


def _named(name: str, build: Callable[..., Table]) -> Table:
    schema, _, bare = name.rpartition(".")
    return build(MetaData(), bare, schema=schema or None)
