"""The outbox: messages written in the application's own transaction, sent by the relay
(:class:`inbox.broker.Relay`, ``inbox-relay``) once that transaction has committed.

:class:`Outbox` is the publishing side. :class:`OutboxRow`, :func:`row_from_mapping` and
:func:`headers_from_json` read the row format (what the relay reads, and what a relay of your
own would read); writing rows is the :class:`Outbox`'s alone.
"""

from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names
from inbox.outbox._outbox import Outbox
from inbox.outbox._row import OutboxRow, headers_from_json, row_from_mapping

__all__ = ["Outbox", "OutboxRow", "headers_from_json", "row_from_mapping"]

_WRITE_WITH_OUTBOX = "rows are written by Outbox.publish; the row format's writers are internal"
# Hidden from type checkers: a module __getattr__ would make mypy accept any attribute of this
# module (a typo included); a deprecated name is then a type error, which is what it should be.
if not TYPE_CHECKING:
    __getattr__ = deprecated_names(
        __name__,
        {
            "row_values": ("inbox.outbox._row", _WRITE_WITH_OUTBOX),
            "headers_to_json": ("inbox.outbox._row", _WRITE_WITH_OUTBOX),
            "resolve_outbox_table": (
                "inbox.outbox._mapping",
                "pass the table or its name to Outbox",
            ),
        },
    )
