"""The outbox: messages written in the application's own transaction, sent by the relay
(:class:`inbox.broker.Relay`, ``inbox-relay``) once that transaction has committed.

:class:`Outbox` is the publishing side. :class:`OutboxRow`, :func:`row_from_mapping` and
:func:`headers_from_json` read the row format (what the relay reads, and what a relay of your
own would read); writing rows is the :class:`Outbox`'s alone.
"""

from inbox._deprecated import deprecated_names
from inbox.outbox._outbox import Outbox
from inbox.outbox._row import OutboxRow, headers_from_json, row_from_mapping

__all__ = ["Outbox", "OutboxRow", "headers_from_json", "row_from_mapping"]

_WRITE_WITH_OUTBOX = "rows are written by Outbox.publish; the row format's writers are internal"
__getattr__ = deprecated_names(
    __name__,
    {
        "row_values": ("inbox.outbox._row", _WRITE_WITH_OUTBOX),
        "headers_to_json": ("inbox.outbox._row", _WRITE_WITH_OUTBOX),
        "resolve_outbox_table": ("inbox.outbox._mapping", "pass the table or its name to Outbox"),
    },
)
