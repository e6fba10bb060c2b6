"""``inbox console``: its options and its run, registered as a subcommand of ``inbox``
(:data:`SUBCOMMAND`, the ``inbox.subcommands`` entry point) without importing the web stack.
The web stack (Starlette, Jinja2, uvicorn) is the ``console`` extra:
``pip install 'sqlalchemy-inbox[console]'``."""

from __future__ import annotations

import argparse
import ipaddress
import os
from typing import Final, TextIO

from sqlalchemy import Engine

from inbox._amqp.connections import BROKER_URL_ENV
from inbox._cli import EXIT_OK, UsageError, whole_number
from inbox.console._audit import LOG_LEVELS, log_to
from inbox.console._auth import PASSWORD_ENV, TOKEN_ENV, USER_ENV, load_credentials
from inbox.console._settings import DEFAULT_HOST, DEFAULT_PORT, ConsoleSettings
from inbox.operations._audit_trail import AUDIT_FILE_ENV
from inbox.operations._status import read_status
from inbox.operations._tables import Tables, tenant_schemas
from inbox.operations._workers import check_worker_url

__all__ = [
    "EXTRA_MISSING",
    "MANAGEMENT_ENV",
    "SECRETS_LINE",
    "SUBCOMMAND",
    "ConsoleCommand",
    "add_options",
    "run",
]

MANAGEMENT_ENV: Final = "INBOX_RABBITMQ_MANAGEMENT_URL"
"""Where ``--rabbitmq-management`` is read from when not given (it may hold a password)."""

EXTRA_MISSING: Final = (
    "inbox console needs the console extra: pip install 'sqlalchemy-inbox[console]'"
)


SECRETS_LINE: Final = (
    f"The token comes only from ${TOKEN_ENV} or --token-file FILE, the password only from "
    f"${PASSWORD_ENV} or --password-file FILE: never from the command line, where ps and "
    "shell histories show it."
)


class _SecretOnCommandLine(argparse.Action):
    """``--token`` or ``--password``: refused with :data:`SECRETS_LINE`, never taken for
    another option."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        raise UsageError(f"{option_string} is not an option. {SECRETS_LINE}", parser.prog)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The console's own options (the database ones are the other commands')."""
    parser.epilog = SECRETS_LINE
    for refused in ("--token", "--password"):
        parser.add_argument(refused, nargs="?", action=_SecretOnCommandLine, help=argparse.SUPPRESS)
    parser.add_argument(
        "--broker",
        help=(
            "RabbitMQ URL, or a Celery app's Redis URL, for the dead letters "
            f"(default ${BROKER_URL_ENV})"
        ),
    )
    parser.add_argument(
        "--queue",
        dest="queues",
        action="append",
        default=[],
        help="a worker's queue whose QUEUE.dlq is shown (repeat)",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument("--port", type=whole_number(1, 65535), default=DEFAULT_PORT)
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow replays, archiving, releases and outbox changes (default: read-only)",
    )
    parser.add_argument(
        "--allow-hard-purge",
        action="store_true",
        help="with --allow-actions: also offer purge, which deletes dead letters for good "
        "(default: they are archived, and can be restored)",
    )
    parser.add_argument("--token-file", help=f"a file holding the token (default ${TOKEN_ENV})")
    parser.add_argument(
        "--password-file",
        help=f"a file holding the HTTP Basic password (default ${PASSWORD_ENV})",
    )
    parser.add_argument("--user", help=f"the HTTP Basic user (default ${USER_ENV} or operator)")
    parser.add_argument("--max-body", type=whole_number(0), default=4096, help="bytes shown")
    parser.add_argument(
        "--worker",
        dest="workers",
        action="append",
        default=[],
        help="a worker's health endpoint, http://HOST:PORT (its --metrics-port): the overview "
        "shows its /readyz (repeat)",
    )
    parser.add_argument(
        "--rabbitmq-management",
        metavar="URL",
        help="RabbitMQ's management API, http://USER:PASSWORD@HOST:15672 (default "
        f"${MANAGEMENT_ENV}): the queues page shows unacked messages and the broker's rates",
    )
    parser.add_argument(
        "--app",
        metavar="MODULE:INBOX",
        help="the application's Inbox (as inbox-worker takes it): an edited dead letter is "
        "checked against its handlers' body types and claim keys before its replay",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="the console's log lines on stderr, the audit lines (info) among them; warning "
        "silences them (default info)",
    )
    parser.add_argument(
        "--audit-file",
        metavar="FILE",
        default=os.environ.get(AUDIT_FILE_ENV) or None,
        help="also append every audit line to FILE, one JSON object a line; the audit page "
        f"reads it back (default ${AUDIT_FILE_ENV})",
    )
    tenants = parser.add_mutually_exclusive_group()
    tenants.add_argument(
        "--schema",
        dest="tenant_schemas",
        action="append",
        default=[],
        help="a tenant schema (sessions_for; repeat): every page has a selector",
    )
    tenants.add_argument(
        "--all-schemas",
        dest="all_tenant_schemas",
        action="store_true",
        help="every schema holding the claims table when the console starts",
    )


def run(
    engine: Engine, tables: Tables, args: argparse.Namespace, broker: str | None, out: TextIO
) -> int:
    """Serve the console until interrupted. Bad credentials are a usage error (exit 2)."""
    credentials = load_credentials(
        token_file=args.token_file, password_file=args.password_file, user=args.user
    )
    try:
        import uvicorn

        from inbox.console._app import create_app
    except ImportError:
        raise UsageError(EXTRA_MISSING) from None
    schemas = tuple(
        tenant_schemas(engine, tables) if args.all_tenant_schemas else args.tenant_schemas
    )
    if args.all_tenant_schemas and not schemas:
        raise UsageError(f"--all-schemas: no schema holds a table {tables.claims.name}")
    application = None
    if args.app:
        from inbox.broker.cli import load_inbox  # imports the application: only when asked

        application = load_inbox(args.app)
    settings = ConsoleSettings(
        engine,
        tables,
        credentials,
        broker,
        tuple(args.queues),
        allow_actions=args.allow_actions,
        allow_hard_purge=args.allow_hard_purge,
        max_body=args.max_body,
        schemas=schemas,
        workers=tuple(check_worker_url(url) for url in args.workers),
        application=application,
        management=_management(args.rabbitmq_management),
        audit_file=args.audit_file,
    )
    first = tables.in_schema(schemas[0]) if schemas else tables
    read_status(engine, first.claims, first.outbox, first.effects)  # fail now, not per page
    log_to(args.log_level, args.audit_file)
    mode = "actions allowed" if args.allow_actions else "read-only"
    out.write(f"inbox console: http://{_shown(args.host)}:{args.port}/ ({mode})\n")
    if not _loopback(args.host):
        out.write(
            "inbox console: listening beyond this machine: serve it behind TLS (a reverse "
            "proxy), or the token and cookie cross the network in clear\n"
        )
    out.flush()
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        # uvicorn's own lines: its startup and errors at warning; every request at debug.
        log_level="debug" if args.log_level == "debug" else "warning",
        proxy_headers=False,
        server_header=False,
    )
    return EXIT_OK


class ConsoleCommand:
    """``inbox console`` as a subcommand of ``inbox`` (its ``Subcommand`` protocol): the
    command adds the database options and connects; the console adds its own and serves."""

    help = "the operator console in a browser (docs/console.md)"
    add_options = staticmethod(add_options)
    run = staticmethod(run)


SUBCOMMAND: Final = ConsoleCommand()
"""What the ``inbox.subcommands`` entry point named ``console`` loads."""


def _management(given: str | None) -> str | None:
    url = given or os.environ.get(MANAGEMENT_ENV) or None
    if url is None:
        return None
    from inbox.operations._queues import check_management_url  # kombu: only when asked

    return check_management_url(url)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host
