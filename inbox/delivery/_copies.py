"""The plan for a retry or dead-letter copy that would not fit in one AMQP frame, shared by
the kombu worker (:mod:`inbox.broker._forwarder`) and the FastStream edge
(:mod:`inbox.faststream._edge`).

The headers the inbox adds can push a delivery whose own headers were near the broker's
``frame_max`` over it, and RabbitMQ answers a header frame over ``frame_max`` by closing
the whole connection: the delivery comes back and the handlers run again, for ever (a NATS
server does the same past its ``max_payload``, headers and body counted). Such a
copy goes to the dead-letter queue instead (``copy-too-large``), with the delivery's own
headers dropped and named, and only the bookkeeping kept. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from inbox.delivery import headers as h
from inbox.delivery._policy import DeadLetterReason

__all__ = ["trimmed_headers"]

# The bookkeeping a trimmed copy keeps of the headers the inbox added.
_KEPT_ADDED: Final = (
    h.TRIES,
    h.FIRST_FAILURE,
    h.LAST_FAILURE,
    h.ERROR,
    h.ERROR_FRAME,
    h.FAILED_HANDLERS,
    h.CLAIM_KEYS,
)
# What it keeps of the delivery's own headers: how to decode the body, and its age.
_KEPT_OWN: Final = ("compression", h.ORIGINAL_FIRST_FAILURE)


def trimmed_headers(own: Mapping[str, Any], added: Mapping[str, Any]) -> dict[str, Any]:
    """The headers of the dead letter that replaces a copy too large for one frame: the
    delivery's ``own`` headers and the ones the inbox ``added`` for the copy, trimmed to the
    bookkeeping, with the reason, the time, and which headers were dropped."""
    dropped = sorted(set(own) | set(added))
    trimmed = {k: v for k, v in added.items() if k in _KEPT_ADDED}
    trimmed[h.REASON] = str(DeadLetterReason.COPY_TOO_LARGE)
    trimmed[h.DEAD_LETTERED_AT] = h.now_utc()
    trimmed[h.ERROR] = h.truncate(
        f"the copy did not fit the broker's size limit; headers dropped: {', '.join(dropped)}"
        + (f"; it was for: {added[h.REASON]}" if h.REASON in added else "")
        + (f"; latest failure: {added[h.ERROR]}" if h.ERROR in added else "")
    )
    for name in _KEPT_OWN:
        if name in own:
            trimmed[name] = own[name]
    source = added.get(h.SOURCE_QUEUE)
    if source is not None:
        trimmed[h.SOURCE_QUEUE] = source
    return trimmed
