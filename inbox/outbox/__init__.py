"""The outbox: messages written in the application's own transaction, sent by a relay once
it commits. :mod:`inbox.outbox._row` is the row format the relay reads."""

from inbox.outbox._row import OutboxRow, headers_from_json, headers_to_json

__all__ = ["OutboxRow", "headers_from_json", "headers_to_json"]
