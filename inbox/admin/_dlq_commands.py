"""``inbox dlq list|show|replay|purge``: from parsed arguments to printed lines and an exit
code, on one channel to the broker (RabbitMQ), or one client (Redis: a Celery app's dead
letters, :mod:`inbox.operations._redis_dead_letters`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from sqlalchemy import Engine, MetaData, Table

from inbox._cli import EXIT_OK, EXIT_USAGE
from inbox.admin import _printing
from inbox.admin._audit import os_user, record
from inbox.admin._commands import EXIT_NOT_FOUND, Streams
from inbox.operations import _archive, _failure_groups, _render, _replay
from inbox.operations import _dead_letters as _dlq
from inbox.operations._dead_letter_sources import open_dead_letters
from inbox.operations._filters import Filters
from inbox.schema import archive_table

__all__ = ["archive_named", "dlq", "dlq_archive"]


def dlq(args: argparse.Namespace, broker: str, io: Streams) -> int:
    """Run one ``inbox dlq`` subcommand; broker errors propagate."""
    if args.dlq_command in ("list", "show"):
        return _read(args, broker, io)
    if args.dlq_command == "groups":
        return _groups(args, broker, io)
    filters = Filters(
        frozenset(args.reason),
        frozenset(args.handler),
        args.older_than,
        frozenset(args.message_ids),
        frozenset(args.groups),
    )
    preview = None
    if args.dlq_command == "purge" and not args.dry_run and not args.yes:
        asked = _confirmed(args, broker, filters, io)
        if isinstance(asked, int):
            return asked
        preview = asked
    with open_dead_letters(broker) as source:
        progress = _progress(io.err) if not args.quiet and io.err.isatty() else None
        if args.dlq_command == "replay":
            report = _replay.replay(
                source,
                args.queue,
                filters,
                limit=args.limit,
                max_read=args.max_read,
                max_replays=args.max_replays,
                keep_tries=args.keep_tries,
                dry_run=args.dry_run,
                progress=progress,
            )
        else:
            report = _replay.purge(
                source,
                args.queue,
                filters,
                limit=args.limit,
                max_read=args.max_read,
                dry_run=args.dry_run,
                progress=progress,
                preview=preview,
            )
    if progress is not None:
        io.err.write("\n")
    if not report.dry_run:
        details = _described(args, filters)
        if args.dlq_command == "replay":
            details |= {"max_replays": args.max_replays, "keep_tries": args.keep_tries}
        record(args, f"dlq.{args.dlq_command}", report.moved, details)
    if not args.quiet:
        io.out.write(f"{_render.move_line(report, args.dlq_command)}\n")
        if report.dry_run:
            _write_taken(report, io.out)
        for letter in report.replayed_too_often:
            io.out.write(
                f"  left (replayed {letter.replays} times): {_printing.dead_letter_line(letter)}\n"
            )
    return EXIT_OK


def _read(args: argparse.Namespace, broker: str, io: Streams) -> int:
    """``inbox dlq list`` and ``inbox dlq show``: dead letters read, left in place."""
    with open_dead_letters(broker) as source:
        if args.dlq_command == "list":
            present, letters = source.peek(args.queue, args.limit)
            if args.json:
                io.out.write(_printing.as_json({"present": present, "dead_letters": letters}))
            else:
                dlq = _dlq.dead_letter_queue(args.queue)
                io.out.write(f"{present} dead letters in {dlq}\n")
                io.out.writelines(f"{_printing.dead_letter_line(x)}\n" for x in letters)
            return EXIT_OK
        found = source.find(args.queue, args.message_id)
    if found is None:
        dlq = _dlq.dead_letter_queue(args.queue)
        io.out.write(f"no dead letter {args.message_id} in {dlq}\n")
        return EXIT_NOT_FOUND
    io.out.writelines(f"{line}\n" for line in _printing.message_lines(*found, args.max_body))
    return EXIT_OK


def archive_named(name: str) -> Table:
    """The archive table named ``[SCHEMA.]NAME`` (``ValueError`` for a name that is not a
    plain identifier)."""
    schema, _, bare = name.rpartition(".")
    return archive_table(MetaData(), bare, schema=schema or None)


def dlq_archive(
    args: argparse.Namespace, broker: str, engine: Engine, table: Table, io: Streams
) -> int:
    """``inbox dlq archive``: the dead letters that pass the filters moved into the archive
    table as the user running the command (bounded as a purge; ``--dry-run`` moves none)."""
    filters = Filters(
        frozenset(args.reason),
        frozenset(args.handler),
        args.older_than,
        frozenset(args.message_ids),
        frozenset(args.groups),
    )
    with open_dead_letters(broker) as source:
        report = _archive.archive(
            source,
            engine,
            table,
            args.queue,
            filters=filters,
            who=os_user(),
            limit=args.limit,
            max_read=args.max_read,
            dry_run=args.dry_run,
        )
    if not report.dry_run:
        command = "purge --archive" if args.dlq_command == "purge" else "archive"
        details = {**_described(args, filters), "command": command}
        record(args, "dlq.archive", report.moved, details)
    if not args.quiet:
        io.out.write(f"{_render.move_line(report, 'archive')}\n")
        if report.dry_run:
            _write_taken(report, io.out)
    return EXIT_OK


def _described(args: argparse.Namespace, filters: Filters) -> dict[str, object]:
    """A move's queue and filters as its audit line holds them (as the console writes them)."""
    return {
        "queue": args.queue,
        "reasons": ",".join(sorted(filters.reasons)) or "any",
        "handlers": ",".join(sorted(filters.handlers)) or "any",
        "older_than": str(filters.older_than) if filters.older_than is not None else "-",
        "ids": ",".join(sorted(filters.message_ids)) or "any",
        **({"groups": ",".join(sorted(filters.groups))} if filters.groups else {}),
        **({"limit": args.limit} if args.limit is not None else {}),
    }


def _groups(args: argparse.Namespace, broker: str, io: Streams) -> int:
    """``inbox dlq groups``: the first ``--limit`` dead letters grouped by how they failed,
    left in place."""
    with open_dead_letters(broker) as source:
        present, letters = source.peek(args.queue, args.limit)
    found = _failure_groups.groups(letters)
    if args.json:
        document = {
            "present": present,
            "read": len(letters),
            "groups": [_printing.group_document(group) for group in found],
        }
        io.out.write(_printing.as_json(document))
        return EXIT_OK
    dlq = _dlq.dead_letter_queue(args.queue)
    io.out.write(
        f"{len(found)} failure groups among {len(letters)} of {present} dead letters in {dlq}\n"
    )
    io.out.writelines(f"{line}\n" for group in found for line in _printing.group_lines(group))
    return EXIT_OK


def _confirmed(
    args: argparse.Namespace, broker: str, filters: Filters, io: Streams
) -> int | _replay.PreviewBound:
    """Ask before a purge, after showing what it would take (a dry run on a channel or
    client of its own: what it read is back in place when the question is asked); without
    a terminal, show it and refuse. The exit code, or the bound of the purge confirmed: no
    more than the preview read and took (a dead letter arriving while the operator reads
    the question is not deleted unseen)."""
    with open_dead_letters(broker) as source:
        preview = _replay.purge(
            source, args.queue, filters, limit=args.limit, max_read=args.max_read, dry_run=True
        )
    io.out.write(f"{_render.move_line(preview, 'purge')}\n")
    _write_taken(preview, io.out)
    if preview.moved == 0:
        return EXIT_OK
    if io.confirm is None:
        io.err.write("inbox: error: refusing to purge without --yes (no terminal to ask on)\n")
        return EXIT_USAGE
    if io.confirm(f"delete these dead letters of {preview.dead_letter_queue} for good?"):
        return _replay.PreviewBound.of(preview)
    io.err.write("inbox: nothing purged\n")
    return EXIT_USAGE


def _write_taken(report: _replay.MoveReport, out: TextIO) -> None:
    """What a dry run would take, one line each (the first :data:`_replay.TAKEN_KEPT`)."""
    out.writelines(f"  {_printing.dead_letter_line(x)}\n" for x in report.taken)
    if report.moved > len(report.taken):
        out.write(f"  ... and {report.moved - len(report.taken)} more\n")


def _progress(err: TextIO) -> Callable[[_replay.MoveReport], None]:
    def show(report: _replay.MoveReport) -> None:
        if report.examined % 100 == 0 or report.examined == report.to_read or report.limit_reached:
            err.write(f"\r{report.examined}/{report.to_read} read, {report.moved} taken")
            err.flush()

    return show
