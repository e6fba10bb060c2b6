"""``inbox-worker``: run a :class:`inbox.broker.Worker` for the user's ``Inbox``.

Exit codes: 0 after a clean stop (SIGTERM or SIGINT: the in-flight message is finished and
acked first); 1 when the broker is unreachable or refuses the topology at start, when the
database is unreachable or its inbox tables are missing or at an older revision (one line
naming the command to run; ``--no-schema-check`` skips that check), or the worker fails;
2 on bad usage (arguments, or a ``MODULE:ATTRIBUTE`` that does not give an ``Inbox``); 3 on a
configuration error met on the first message (``SessionConfigurationError``,
``UnsupportedDialect``): that delivery is requeued untouched, nothing is retried or
dead-lettered.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from inbox._amqp.connections import BROKER_URL_ENV, broker_connection, safe_uri
from inbox._cli import (
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UsageParser,
    VersionRequested,
    add_version,
    usage_line,
    whole_number,
)
from inbox._cli.logs import LOG_FORMATS, configure_logging
from inbox._cli.signals import install_signal_handlers
from inbox._oneline import database_error_line
from inbox.broker._health_cli import add_health_arguments, health_server
from inbox.broker._relay_thread import RelayThread, relay_for, running_beside
from inbox.broker.worker import Worker
from inbox.core import Inbox
from inbox.core._startup import (
    SchemaNotReady,
    effect_store,
    wait_for_schema,
    worker_engine,
    worker_tables,
)
from inbox.delivery.codec import JSON
from inbox.delivery.topology import DEFAULT_MAX_TRIES, DEFAULT_RETRY_DELAYS, QueueType, RetryPolicy
from inbox.errors import ConfigurationError, SessionConfigurationError, UnsupportedDialect

__all__ = ["load_inbox", "worker_main"]

EXIT_BROKER_ERROR = EXIT_DATABASE_ERROR
EXIT_CONFIGURATION_ERROR = 3


def _worker_parser() -> UsageParser:
    parser = UsageParser(
        prog="inbox-worker",
        description=(
            "Consume queues and run every delivery through an Inbox exactly once: ack after "
            "commit, retries with backoff through delayed-retry queues, dead letters in "
            "<queue>.dlq with the reason in their headers."
        ),
    )
    parser.add_argument("target", metavar="MODULE:ATTRIBUTE", help="where your Inbox lives")
    parser.add_argument(
        "--broker", default=None, help=f"kombu broker URL (default: ${BROKER_URL_ENV})"
    )
    parser.add_argument(
        "--queue", dest="queues", action="append", required=True, help="queue to consume (repeat)"
    )
    parser.add_argument(
        "--prefetch",
        type=whole_number(1, 65535),
        default=None,
        help="unacked deliveries per queue (default 10, or the batch size if larger)",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1, 65535),
        default=1,
        help=(
            "process up to N deliveries at hand in one transaction, one claim statement per "
            "handler; a failing message is isolated by splitting the batch (default 1: off)"
        ),
    )
    parser.add_argument(
        "--max-tries",
        type=whole_number(1, 1000),
        default=DEFAULT_MAX_TRIES,
        help=f"attempts before dead-lettering, the first included (default {DEFAULT_MAX_TRIES})",
    )
    parser.add_argument(
        "--retry-delays",
        type=_delays,
        default=DEFAULT_RETRY_DELAYS,
        help="seconds between tries, comma-separated; the last repeats (default 1,5,30)",
    )
    parser.add_argument(
        "--queue-type", choices=[t.value for t in QueueType], default=QueueType.CLASSIC.value
    )
    parser.add_argument(
        "--no-declare",
        dest="declare",
        action="store_false",
        help="do not declare queues, only check they exist (infrastructure owns them)",
    )
    parser.add_argument(
        "--default-content-type",
        default=JSON,
        help="how to decode deliveries without a content type ('none': raw bytes)",
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
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="also relay the outbox table of the inbox's database to this broker (docs/outbox.md)",
    )
    parser.add_argument(
        "--relay-table", default="outbox_message", help="the outbox table --relay sends from"
    )
    parser.add_argument(
        "--tracebacks",
        action="store_true",
        help="log tracebacks of handler failures (as at DEBUG; they may hold SQL and row data)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="one line per record: text or json",
    )
    parser.add_argument(
        "--no-schema-check",
        dest="schema_check",
        action="store_false",
        help="start without checking that the inbox tables exist at the needed revision",
    )
    add_health_arguments(parser)
    add_version(parser)
    return parser


def _delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in text.split(","))
        RetryPolicy(delays, max_tries=2)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected seconds like 1,5,30 (each at least 0.001), got {text!r}: {exc}"
        ) from None
    return delays


def load_inbox(target: str) -> Inbox:
    """Import ``MODULE:ATTRIBUTE`` (the attribute may be dotted) and return the ``Inbox`` it
    names, or that a zero-argument factory there returns. Raises ``ValueError`` otherwise."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"expected MODULE:ATTRIBUTE, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, Inbox) and callable(found):
        try:
            found = found()
        except Exception as exc:
            raise ConfigurationError(f"{target}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Inbox):
        raise ConfigurationError(f"{target} is a {type(found).__name__}, not an inbox.Inbox")
    return found


def worker_main(argv: Sequence[str] | None = None, *, stderr: TextIO | None = None) -> int:
    """Run ``inbox-worker``; see the module docstring for the exit codes."""
    err = sys.stderr if stderr is None else stderr
    parser = _worker_parser()
    try:
        args = parser.parse_args(argv)
        broker = args.broker or os.environ.get(BROKER_URL_ENV)
        if not broker:
            raise ConfigurationError(f"no broker: pass --broker or set {BROKER_URL_ENV}")
        configure_logging(args.log_level, args.tracebacks, err, args.log_format)
        connection = broker_connection(broker)
        inbox = load_inbox(args.target)
        content_type = (
            None if args.default_content_type.lower() == "none" else args.default_content_type
        )
        worker = Worker(
            inbox,
            connection,
            args.queues,
            prefetch=max(10, args.batch_size) if args.prefetch is None else args.prefetch,
            batch_size=args.batch_size,
            retry=RetryPolicy(args.retry_delays, args.max_tries),
            queue_type=args.queue_type,
            declare=args.declare,
            default_content_type=content_type,
            stats_interval=args.stats_interval,
        )
        relay = (
            RelayThread(relay_for(inbox, connection, args.relay_table), worker)
            if args.relay
            else None
        )
        health = health_server(args, worker, inbox, relay.relay if relay else None)
    except VersionRequested as version:
        sys.stdout.write(f"{version.line}\n")
        return EXIT_OK
    except (UsageError, ValueError, TypeError, KeyError, ImportError) as exc:
        err.write(usage_line("inbox-worker", exc))
        return EXIT_USAGE
    if args.schema_check and (failed := _schema_error(inbox, args.connect_retries)):
        err.write(f"inbox-worker: error: {failed}\n")
        return EXIT_DATABASE_ERROR
    where = safe_uri(worker.connection)
    try:
        worker.prepare(max_retries=args.connect_retries)
    except KeyboardInterrupt:
        err.write("inbox-worker: interrupted while connecting\n")
        return EXIT_BROKER_ERROR
    except Exception as exc:  # the CLI edge: one line, never a traceback
        err.write(f"inbox-worker: error: broker {where}: {_first_line(exc)}\n")
        return EXIT_BROKER_ERROR
    install_signal_handlers(worker if relay is None else relay)
    if health is not None:
        health.start()
    try:
        with running_beside(relay, args.connect_retries):
            worker.run()
    except KeyboardInterrupt:
        err.write("inbox-worker: stopped at once; the in-flight message will be redelivered\n")
        return EXIT_BROKER_ERROR
    except (SessionConfigurationError, UnsupportedDialect) as exc:
        err.write(
            f"inbox-worker: configuration error: {_first_line(exc)} (the message was requeued "
            "untouched; fix the configuration and start again)\n"
        )
        return EXIT_CONFIGURATION_ERROR
    except Exception as exc:
        err.write(f"inbox-worker: error: {_first_line(exc)}\n")
        return EXIT_BROKER_ERROR
    finally:
        if health is not None:
            health.stop()
    return EXIT_OK


def _schema_error(inbox: Inbox, retries: int) -> str | None:
    """Why the database is not ready for this worker, on one line; None when it is."""
    engine = worker_engine(inbox)
    if engine is None:
        return None
    checks = [(engine, worker_tables(inbox))]
    if (store := effect_store(inbox)) is not None:
        checks.append((store[0], (store[1],)))
    for checked, tables in checks:
        try:
            wait_for_schema(checked, tables, retries=retries)
        except SchemaNotReady as exc:
            return str(exc)
        except Exception as exc:  # unreachable, refused: one line, never a traceback
            return database_error_line(exc, checked.url)
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
