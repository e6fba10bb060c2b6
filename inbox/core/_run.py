"""The handler run in progress: which inbox runs which handler under which claim key.

The handler transaction sets it for exactly the duration of the handler call (one
``ContextVar`` set and reset per handler), so ``inbox.effect`` knows what it is the effect
of without the handler passing anything, and refuses to work anywhere else.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from inbox.errors import EffectError

__all__ = ["CURRENT_RUN", "HandlerRun", "current_run"]


@dataclass(slots=True)
class HandlerRun:
    """One handler call: the inbox running it, its claim key (16 bytes), its name, the
    connection holding its claim, the id and headers of the message it runs on (for log
    lines, and for the causation and conversation headers of what ``Outbox.publish`` sends
    from it), and the effect steps it is inside right now (made by the first effect: most
    handler runs make none)."""

    owner: object
    claim_key: bytes
    handler: str
    connection: Connection
    message_id: uuid.UUID
    message_headers: Mapping[str, Any]
    entered: set[str] | None = None

    def inside(self, step: str) -> bool:
        """Whether the call of effect ``step`` is running now."""
        return self.entered is not None and step in self.entered

    def enter(self, step: str) -> None:
        """The call of effect ``step`` starts."""
        if self.entered is None:
            self.entered = set()
        self.entered.add(step)

    def leave(self, step: str) -> None:
        """The call of effect ``step`` has ended."""
        if self.entered is not None:
            self.entered.discard(step)


CURRENT_RUN: ContextVar[HandlerRun | None] = ContextVar("inbox_handler_run", default=None)


def current_run(owner: object) -> HandlerRun:
    """The handler run of ``owner`` in progress here, else :class:`~inbox.EffectError`."""
    run = CURRENT_RUN.get()
    if run is None:
        raise EffectError(
            "inbox.effect() works only while a handler of this inbox runs (it needs the "
            "handler's claim key): call it from inside the handler, in the handler's own thread "
            "or task; a batch handler has no single claim key, so it cannot make effects"
        )
    if run.owner is not owner:
        raise EffectError(
            f"inbox.effect() was called on another inbox than the one running handler "
            f"{run.handler!r}: call effect() on the inbox the handler is registered on"
        )
    return run
