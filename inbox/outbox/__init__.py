"""The outbox: messages written in the application's own transaction, sent by the relay
(:class:`inbox.broker.Relay`, ``inbox-relay``) once that transaction has committed.

:class:`Outbox` is the publishing side. :mod:`inbox.outbox._row` is the row format the relay
reads (:class:`OutboxRow`, :func:`headers_to_json`, :func:`headers_from_json`).
"""

from inbox.outbox._mapping import resolve_outbox_table
from inbox.outbox._outbox import Outbox
from inbox.outbox._row import OutboxRow, headers_from_json, headers_to_json

__all__ = ["Outbox", "OutboxRow", "headers_from_json", "headers_to_json", "resolve_outbox_table"]
