"""``inbox dlq list|show|replay|purge``: from parsed arguments to printed lines and an exit
code, on one channel to the broker (RabbitMQ), or one client (Redis: a Celery app's dead
letters, :mod:`inbox.operations._redis_dead_letters`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TextIO

from inbox._cli import EXIT_OK, EXIT_USAGE
from inbox.admin import _printing
from inbox.admin._commands import EXIT_NOT_FOUND, Streams
from inbox.operations import _dead_letters as _dlq
from inbox.operations import _render, _replay
from inbox.operations._dead_letters import DeadLetterRecord
from inbox.operations._filters import Filters

__all__ = ["dlq"]


class _DeadLetters(Protocol):
    """The dead letters of one broker, as the subcommands use them."""

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]: ...

    def find(self, queue: str, message_id: str) -> tuple[Mapping[str, Any], bytes] | None: ...

    def replay(
        self,
        queue: str,
        filters: Filters,
        *,
        limit: int | None,
        max_replays: int,
        keep_tries: bool,
        dry_run: bool,
        progress: Callable[[_replay.MoveReport], None] | None,
    ) -> _replay.MoveReport: ...

    def purge(
        self,
        queue: str,
        filters: Filters,
        *,
        limit: int | None,
        dry_run: bool,
        progress: Callable[[_replay.MoveReport], None] | None,
    ) -> _replay.MoveReport: ...


@contextmanager
def _dead_letters(broker: str) -> Iterator[_DeadLetters]:
    if broker.partition("://")[0] in {"redis", "rediss"}:
        # Imported here: redis-py comes with the celery extra, not with the inbox command.
        from inbox.operations import _redis_dead_letters

        with _redis_dead_letters.open_redis(broker) as letters:
            yield letters
    else:
        with _dlq.open_channel(broker) as channel:
            yield _replay.RabbitDeadLetters(channel)


def dlq(args: argparse.Namespace, broker: str, io: Streams) -> int:
    """Run one ``inbox dlq`` subcommand; broker errors propagate."""
    with _dead_letters(broker) as source:
        if args.dlq_command == "list":
            present, letters = source.peek(args.queue, args.limit)
            if args.json:
                io.out.write(_printing.as_json({"present": present, "dead_letters": letters}))
            else:
                io.out.write(f"{present} dead letters in {_dlq.dead_letter_queue(args.queue)}\n")
                io.out.writelines(f"{_printing.dead_letter_line(x)}\n" for x in letters)
            return EXIT_OK
        if args.dlq_command == "show":
            found = source.find(args.queue, args.message_id)
            if found is None:
                io.out.write(
                    f"no dead letter {args.message_id} in {_dlq.dead_letter_queue(args.queue)}\n"
                )
                return EXIT_NOT_FOUND
            io.out.writelines(
                f"{line}\n" for line in _printing.message_lines(*found, args.max_body)
            )
            return EXIT_OK
        filters = Filters(
            frozenset(args.reason),
            frozenset(args.handler),
            args.older_than,
            frozenset(args.message_ids),
        )
        if args.dlq_command == "purge" and not args.dry_run and not _confirmed(args, io):
            return EXIT_USAGE
        progress = _progress(io.err) if not args.quiet and io.err.isatty() else None
        if args.dlq_command == "replay":
            report = source.replay(
                args.queue,
                filters,
                limit=args.limit,
                max_replays=args.max_replays,
                keep_tries=args.keep_tries,
                dry_run=args.dry_run,
                progress=progress,
            )
        else:
            report = source.purge(
                args.queue,
                filters,
                limit=args.limit,
                dry_run=args.dry_run,
                progress=progress,
            )
    if progress is not None:
        io.err.write("\n")
    if not args.quiet:
        io.out.write(f"{_render.move_line(report, args.dlq_command)}\n")
        for letter in report.replayed_too_often:
            io.out.write(
                f"  left (replayed {letter.replays} times): {_printing.dead_letter_line(letter)}\n"
            )
    return EXIT_OK


def _confirmed(args: argparse.Namespace, io: Streams) -> bool:
    if args.yes:
        return True
    if io.confirm is None:
        io.err.write("inbox: error: refusing to purge without --yes (no terminal to ask on)\n")
        return False
    if io.confirm(
        f"delete the matching dead letters of {_dlq.dead_letter_queue(args.queue)} for good?"
    ):
        return True
    io.err.write("inbox: nothing purged\n")
    return False


def _progress(err: TextIO) -> Callable[[_replay.MoveReport], None]:
    def show(report: _replay.MoveReport) -> None:
        if report.examined % 100 == 0 or report.examined == report.to_read:
            err.write(f"\r{report.examined}/{report.to_read} read, {report.moved} taken")
            err.flush()

    return show
