"""What one console serves: the database tables, the broker and its queues, whether it may
change anything, and who may use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Engine

from inbox.console._auth import Credentials
from inbox.errors import ConfigurationError
from inbox.operations._edit import Application
from inbox.operations._tables import Tables

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ConsoleSettings"]

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8765


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """Everything :func:`inbox.console.create_app` needs, given once.

    ``broker`` and ``queues``: the RabbitMQ URL and the workers' queues whose dead-letter
    queues (``<queue>.dlq``) the console shows (none: no dead-letter pages).
    ``allow_actions``: False (the default) serves a read-only console that refuses every
    change. ``max_body``: the bytes of a message body shown, at most; ``peek_limit``: the
    dead letters of a queue read for its page.
    """

    engine: Engine
    tables: Tables
    credentials: Credentials
    broker: str | None = None
    queues: tuple[str, ...] = ()
    allow_actions: bool = False
    max_body: int = 4096
    peek_limit: int = 100
    workers: tuple[str, ...] = ()
    """The workers' ``/readyz`` URLs (``inbox-worker --metrics-port``) the overview asks."""
    schemas: tuple[str, ...] = ()
    """Tenant schemas (``sessions_for``): each page works on the one chosen on the page, with
    the tables' unqualified names in it. None: the tables as given."""
    management: str | None = None
    """RabbitMQ's management API (``http://USER:PASSWORD@HOST:15672``): the queues page
    shows unacked messages and the broker's rates. None: depth and consumers from AMQP,
    the out rate from the workers' counters."""
    application: Application | None = None
    """The application's ``Inbox`` (or ``AsyncInbox``; ``inbox console --app``): an edited
    dead letter is checked against its handlers' body types and claim keys before a
    replay. None: only the JSON is checked."""

    allow_hard_purge: bool = False
    """Offer purge, which deletes dead letters for good (with ``allow_actions``); without it
    they are archived (:mod:`inbox.operations._archive`) and purge is refused."""
    audit_file: str | None = None
    """The audit file (``inbox console --audit-file``): the audit page reads it back, newest
    first, with the records of earlier runs and of the ``inbox`` command. None: the page
    shows this process's own records."""

    def __post_init__(self) -> None:
        if self.schemas and any(
            t.schema for t in (self.tables.claims, self.tables.effects, self.tables.outbox)
        ):
            raise ConfigurationError("with schemas, table names are NAME, not SCHEMA.NAME")
        if self.allow_hard_purge and not self.allow_actions:
            raise ConfigurationError("--allow-hard-purge needs --allow-actions")
        if self.queues and not self.broker:
            raise ConfigurationError("dead-letter queues need a broker URL")
        if self.max_body < 0 or self.peek_limit < 1:
            raise ConfigurationError("max_body must be >= 0 and peek_limit >= 1")
