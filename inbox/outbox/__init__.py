"""The outbox: messages written in the application's own transaction, sent by the relay
(:class:`inbox.broker.Relay`, ``inbox-relay``) once that transaction has committed.

:class:`Outbox` is the publishing side. :class:`OutboxRow`, :func:`row_from_mapping`,
:func:`row_values`, :func:`headers_to_json` and :func:`headers_from_json` are the row format
(what the relay reads, and what a relay of your own would read).
"""

from inbox.outbox._mapping import resolve_outbox_table
from inbox.outbox._outbox import Outbox
from inbox.outbox._row import (
    OutboxRow,
    headers_from_json,
    headers_to_json,
    row_from_mapping,
    row_values,
)

__all__ = [
    "Outbox",
    "OutboxRow",
    "headers_from_json",
    "headers_to_json",
    "resolve_outbox_table",
    "row_from_mapping",
    "row_values",
]
