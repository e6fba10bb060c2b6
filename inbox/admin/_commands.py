"""The subcommands of ``inbox``, each from parsed arguments to printed lines and an exit
code. Errors propagate to :func:`inbox.admin.cli.admin_main`, which prints them as one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from sqlalchemy import Engine

from inbox._cli import EXIT_OK, EXIT_USAGE, UsageError
from inbox.admin import _printing
from inbox.admin._audit import record
from inbox.operations import _claims, _render, _status
from inbox.operations import _dead_letter_sources as sources
from inbox.operations import _dead_letters as dead_letters
from inbox.operations._tables import Tables, tenant_schemas

__all__ = [
    "EXIT_NOT_FOUND",
    "Command",
    "Streams",
    "check_per_schema",
    "release",
    "show",
    "status",
    "terminal_confirm",
]

EXIT_NOT_FOUND = 3


@dataclass(frozen=True, slots=True)
class Streams:
    """Where output goes, and how to ask yes or no (None: there is no one to ask)."""

    out: TextIO
    err: TextIO
    confirm: Callable[[str], bool] | None


Command = Callable[[Engine, Tables, argparse.Namespace, str | None, Streams], int]
"""A subcommand's run on the database (``status``, ``show``, ``release``, and those of other
packages): the parser names it for its subcommand (``set_defaults(run=...)``)."""


def terminal_confirm() -> Callable[[str], bool] | None:
    """A yes/no question on the terminal; None when stdin is not one (cron, a pipe)."""
    if not sys.stdin.isatty():
        return None

    def ask(question: str) -> bool:
        sys.stderr.write(f"{question} [y/N] ")
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


def status(
    engine: Engine, tables: Tables, args: argparse.Namespace, broker: str | None, io: Streams
) -> int:
    """``inbox status`` (one report per tenant schema with ``--schema`` or
    ``--all-schemas``)."""
    if args.schemas or args.all_schemas:
        return _status_per_schema(engine, tables, args, io)
    report = _status.read_status(engine, tables.claims, tables.outbox, tables.effects)
    for queue in args.queues:
        assert broker is not None  # checked with the arguments
        name = dead_letters.dead_letter_queue(queue)
        # A queue that is not there is part of the report (None), not its end.
        report.dead_letters[name] = sources.depth_if_present(broker, name)
    if args.json:
        io.out.write(_printing.as_json(report))
    else:
        io.out.writelines(f"{line}\n" for line in _printing.status_lines(report))
    return EXIT_OK


def check_per_schema(args: argparse.Namespace) -> None:
    """Refuse what ``status --schema/--all-schemas`` cannot do: qualified table names (the
    schema is each tenant's) and ``--queue`` (dead letters belong to no one schema)."""
    if args.queues:
        raise UsageError("--queue cannot be combined with --schema or --all-schemas")
    for name in (args.table, args.effect_table, args.outbox_table):
        if "." in name:
            raise UsageError(
                "with --schema or --all-schemas, table names are NAME, not SCHEMA.NAME"
            )


def _status_per_schema(
    engine: Engine, tables: Tables, args: argparse.Namespace, io: Streams
) -> int:
    """``inbox status --schema ... | --all-schemas``: one report per tenant schema (a list
    of documents with ``--json``)."""
    schemas = tenant_schemas(engine, tables) if args.all_schemas else args.schemas
    reports = [
        _status.read_status(engine, tenant.claims, tenant.outbox, tenant.effects)
        for tenant in (tables.in_schema(schema) for schema in schemas)
    ]
    if args.json:
        io.out.write(_printing.as_json(reports))
        return EXIT_OK
    for index, report in enumerate(reports):
        if index:
            io.out.write("\n")
        io.out.writelines(f"{line}\n" for line in _printing.status_lines(report))
    return EXIT_OK


def show(
    engine: Engine, tables: Tables, args: argparse.Namespace, broker: str | None, io: Streams
) -> int:
    """``inbox show``: exit 3 when no handler processed the message. With ``--queue``, a
    message id no claim has is looked up in the dead-letter queues too, under the keys its
    dead letter names (:func:`inbox.operations._claims.look_up`)."""
    lookup = _claims.look_up(
        engine,
        tables.claims,
        tables.effects,
        args.id_or_key,
        business_key=args.key,
        handler=args.handler,
        broker=broker,
        queues=args.queues,
    )
    found = lookup.found
    if args.json:
        io.out.write(_printing.as_json(found))
        return EXIT_OK if found.claims else EXIT_NOT_FOUND
    if lookup.dead_letter_queue is not None:
        io.out.write(f"the keys its dead letter in {lookup.dead_letter_queue} names:\n")
    if found:
        io.out.writelines(f"{line}\n" for line in _render.found_lines(found))
    else:
        io.out.write(f"no claim for {_asked(lookup.keys, args.handler)}\n")
    for dlq, present in lookup.read_in_part:
        line = _render.read_in_part_line(dlq, present, _claims.DEAD_LETTERS_READ)
        io.out.write(f"{line}\n")
    if not found.claims and lookup.keys[0].how == "message id":
        io.out.writelines(f"{line}\n" for line in _render.message_id_hint(bool(args.queues)))
    return EXIT_OK if found.claims else EXIT_NOT_FOUND


def release(
    engine: Engine, tables: Tables, args: argparse.Namespace, broker: str | None, io: Streams
) -> int:
    """``inbox release``: exit 3 when there was nothing to release, 2 when not confirmed."""
    keys = _lookup(args)
    found = _claims.find(engine, tables.claims, tables.effects, keys, args.handler)
    if not found:
        io.out.write(
            f"nothing to release: no claim or effect record for {_asked(keys, args.handler)}\n"
        )
        holding = _claims.handlers_holding(engine, tables.claims, tables.effects, keys)
        if holding:
            io.out.write(
                f"handlers holding claims or effect records for it: {', '.join(holding)} "
                "(release one with --handler NAME)\n"
            )
        return EXIT_NOT_FOUND
    io.out.writelines(f"{line}\n" for line in _render.found_lines(found))
    if not args.yes:
        question = (
            f"release these {len(found.claims)} claim(s) and {len(found.effects)} effect record(s)?"
        )
        if io.confirm is None:
            io.err.write(
                "inbox: error: refusing to release without --yes (no terminal to ask on)\n"
            )
            return EXIT_USAGE
        if not io.confirm(question):
            io.err.write("inbox: nothing released\n")
            return EXIT_USAGE
    claims, effects = _claims.release(engine, tables.claims, tables.effects, keys, args.handler)
    details = {"handler": args.handler, "lookup": args.id_or_key, "effects": effects}
    record(args, "claims.release", claims, details)
    io.out.write(
        f"released: {claims} claim(s) and {effects} effect record(s) "
        f"of {args.handler} deleted; the next delivery runs it again\n"
    )
    return EXIT_OK


def _lookup(args: argparse.Namespace) -> tuple[_claims.LookupKey, ...]:
    """The claim keys ``ID-OR-KEY`` stands for (``--key``: the business key alone)."""
    return _claims.lookup_keys(args.id_or_key, business_key=args.key)


def _asked(keys: tuple[_claims.LookupKey, ...], handler: str | None) -> str:
    what = " or ".join(f"the {k.how}" for k in keys)
    return what + (f" and handler {handler}" if handler else "")
