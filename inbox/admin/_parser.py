"""The ``inbox`` command's grammar: its subcommands, their options and their help, as one
argparse parser (and each subcommand's, for the generated CLI reference)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine

from inbox._amqp.connections import BROKER_URL_ENV
from inbox._cli import (
    DATABASE_URL_ENV,
    UsageParser,
    add_version,
    whole_number,
)
from inbox.admin import _commands
from inbox.admin._audit import add_audit_option
from inbox.admin._subcommands import Subcommand, discovered
from inbox.operations._filters import dead_letter_reason, duration, failure_group
from inbox.operations._tables import Tables
from inbox.schema import (
    DEFAULT_ARCHIVE_TABLE_NAME,
    DEFAULT_EFFECT_TABLE_NAME,
    DEFAULT_OUTBOX_TABLE_NAME,
    DEFAULT_TABLE_NAME,
)

__all__ = ["command_parsers", "usage_parser"]

_T = TypeVar("_T")


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of ``inbox``, by command line (``"inbox"``, ``"inbox status"``,
    ``"inbox dlq replay"``...): what the CLI reference of the docs is generated from."""
    parsers: dict[str, argparse.ArgumentParser] = {}
    usage_parser(parsers)
    return parsers


def usage_parser(parsers: dict[str, argparse.ArgumentParser] | None = None) -> UsageParser:
    parser = UsageParser(
        prog="inbox",
        description="Look into and repair an inbox: claims, effects, outbox, dead letters.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)

    status = commands.add_parser("status", help="claims per handler, outbox, effects, dead letters")
    _database_options(status, _commands.status)
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
    _database_options(show, _commands.show)
    _key_options(show)
    _show_options(show)

    release = commands.add_parser(
        "release", help="delete a handler's claim and effect records: the next delivery re-runs it"
    )
    _database_options(release, _commands.release)
    _key_options(release)
    release.add_argument("--handler", required=True, help="the handler to run again")
    release.add_argument("--yes", action="store_true", help="do not ask")
    add_audit_option(release)

    upgrade = commands.add_parser(
        "migrate",
        help="create or upgrade the inbox's tables: the shipped revisions, from the package",
    )
    upgrade.add_argument("--database-url", help=f"SQLAlchemy URL (default ${DATABASE_URL_ENV})")
    upgrade.add_argument(
        "--revision", default="head", help="an inbox revision to upgrade to (default: head)"
    )

    dlq_parsers = _dlq_parsers(
        commands.add_parser("dlq", help="a worker's dead-letter queue <QUEUE>.dlq")
    )

    for name, subcommand in discovered().items():  # inbox console, registered by the console
        added = commands.add_parser(name, help=subcommand.help)
        _database_options(added, _run_of(subcommand))
        subcommand.add_options(added)

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
        parsers.update({f"inbox dlq {name}": p for name, p in dlq_parsers.items()})
    return parser


def _run_of(subcommand: Subcommand) -> _commands.Command:
    """A registered subcommand's run, handed the output stream it writes to."""

    def run(
        engine: Engine,
        tables: Tables,
        args: argparse.Namespace,
        broker: str | None,
        io: _commands.Streams,
    ) -> int:
        return subcommand.run(engine, tables, args, broker, io.out)

    return run


def _show_options(show: argparse.ArgumentParser) -> None:
    show.add_argument("--handler", help="only this handler")
    show.add_argument("--json", action="store_true", help="one JSON document")
    show.add_argument(
        "--queue",
        dest="queues",
        action="append",
        default=[],
        help="a message id no claim has: look for its dead letter in QUEUE.dlq, whose "
        "x-inbox-claim-keys name the keys its handlers claim under; repeat",
    )
    show.add_argument("--broker", help=f"with --queue (default ${BROKER_URL_ENV})")


def _database_options(parser: argparse.ArgumentParser, run: _commands.Command) -> None:
    """The options of a subcommand on the database, and its run."""
    parser.set_defaults(run=run)
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
    add_audit_option(parser)
    parser.add_argument(
        "--limit", type=whole_number(1), help="take at most N of the dead letters that match"
    )
    parser.add_argument(
        "--max-read",
        type=whole_number(1),
        help="read at most N dead letters (default: all those present at the start)",
    )
    parser.add_argument(
        "--reason",
        action="append",
        default=[],
        type=_argument(dead_letter_reason),
        help="only this reason, as x-inbox-reason says it (handler-failed, ...; repeat)",
    )
    parser.add_argument("--handler", action="append", default=[], help="only if H failed (repeat)")
    parser.add_argument(
        "--id",
        dest="message_ids",
        action="append",
        default=[],
        help="only this message: its id, or the ref=sha256:... that list shows for one "
        "without (repeat)",
    )
    parser.add_argument(
        "--group",
        dest="groups",
        action="append",
        default=[],
        type=_argument(failure_group),
        help="only this failure group, the fp-... id inbox dlq groups shows (repeat)",
    )
    parser.add_argument(
        "--older-than",
        type=_argument(duration),
        help="only dead-lettered at least this long ago (30m, 7d)",
    )
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no progress or summary")


def _dlq_parsers(dlq: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``inbox dlq``; their parsers by name (for the reference)."""
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=UsageParser)
    listing = dlq_commands.add_parser("list", help="the first dead letters, left in place")
    _broker_options(listing)
    listing.add_argument("--limit", type=whole_number(1, 10_000), default=20)
    listing.add_argument("--json", action="store_true", help="one JSON document")
    grouped = dlq_commands.add_parser(
        "groups",
        help="the dead letters read grouped by how they failed (reason, handlers, exception, "
        "error text with ids and numbers normalised), left in place",
    )
    _broker_options(grouped)
    grouped.add_argument(
        "--limit",
        type=whole_number(1, 10_000),
        default=1000,
        help="group the first N dead letters (default 1000)",
    )
    grouped.add_argument("--json", action="store_true", help="one JSON document")
    show_one = dlq_commands.add_parser("show", help="one dead letter in full, left in place")
    _broker_options(show_one)
    show_one.add_argument(
        "message_id",
        metavar="MESSAGE-ID",
        help="its message id, or the ref=sha256:... that list shows for one without",
    )
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
    archive = dlq_commands.add_parser(
        "archive",
        help="move dead letters into the archive table of the inbox's database (the console "
        "restores or deletes them; inbox-cleanup --archive-days expires them)",
    )
    _move_options(archive)
    archive.add_argument("--database-url", help=f"SQLAlchemy URL (default ${DATABASE_URL_ENV})")
    archive.add_argument(
        "--archive-table", default=DEFAULT_ARCHIVE_TABLE_NAME, help="[SCHEMA.]NAME"
    )
    purge = dlq_commands.add_parser(
        "purge", help="delete dead letters for good (--archive: keep them in the archive)"
    )
    _move_options(purge)
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.add_argument(
        "--archive",
        action="store_true",
        help="move them into the archive table instead, as inbox dlq archive does (they can "
        "be restored; nothing is asked, since nothing is lost)",
    )
    purge.add_argument(
        "--database-url", help=f"with --archive: SQLAlchemy URL (default ${DATABASE_URL_ENV})"
    )
    purge.add_argument(
        "--archive-table", default=DEFAULT_ARCHIVE_TABLE_NAME, help="with --archive: [SCHEMA.]NAME"
    )
    return dict(dlq_commands.choices)


def _broker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        help=f"RabbitMQ URL, or redis:// for Celery dead letters (default ${BROKER_URL_ENV})",
    )
    parser.add_argument("--queue", required=True, help="the worker's queue (its .dlq is read)")


def _argument(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """An argparse ``type`` from an operation's reader: its ``ValueError`` becomes argparse's
    own error, so the usage line says what the reader said."""

    def read(text: str) -> _T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = parse.__name__
    return read
