"""A decision carried out, written once for every edge: :func:`plan` is a generator of the
actions to take (ack, copy, hold, give back, stop), sent each action's result; the shells in
:mod:`inbox.delivery.transport` only carry the actions out on a transport, one blocking, one
awaiting (the way :func:`inbox.core._settlement.settle` is shared by the two inboxes).

It owns the rules of a copy: a copy the broker refused is tried again after a hold that
doubles up to :data:`~inbox.delivery._settling.MAX_REFUSAL_WAIT` (the handlers do not run
again); a copy the transport says does not fit its size limit goes to ``<queue>.dlq``
instead, its own headers trimmed (``copy-too-large``); the original is acked only once its
copy is confirmed. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeAlias

from inbox.delivery._inbound import Inbound
from inbox.delivery._policy import Ack, DeadLetter, Decision, Halt, Retry
from inbox.delivery._settling import Settling
from inbox.errors import CopyRefused
from inbox.message import Message

__all__ = [
    "Ack",
    "Action",
    "Copy",
    "CopyResult",
    "GiveBack",
    "Hold",
    "Observer",
    "Plan",
    "Reply",
    "Routes",
    "Stop",
    "giving_back",
    "plan",
]

# Ack (the decision's own value, re-exported) is also the action "ack the delivery": send
# back whether the broker took the ack (False: the delivery's channel is gone).


@dataclass(frozen=True, slots=True)
class Copy:
    """Action: send a copy of the delivery's body to ``target`` with ``headers`` (all of
    them: the delivery's own and the inbox's), confirmed by the broker. ``delay_ms`` is a
    retry's delay (0 for a dead letter, or after a hold): a broker that delays a copy
    without a queue of its own uses it (JetStream's NAK with a delay). A ``trimmed`` copy
    (already cut down to fit) is sent without asking whether it fits. Send back a
    :class:`CopyResult` or the :class:`CopyRefused`."""

    target: str
    headers: Mapping[str, Any]
    delay_ms: int = 0
    trimmed: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """Action: keep the delivery unsettled for ``seconds``, then resume the plan (send back
    None), or :data:`CopyResult.STOPPING` when the edge stops and will not wait."""

    seconds: float


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Action: give the delivery back to the broker untouched; send back whether the broker
    took it (False: the channel is gone, the broker gives it back anyway)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Action, the last of a halt: stop consuming, ``error`` (a configuration error) is why.
    Send back None."""

    error: BaseException


class CopyResult(Enum):
    """What a :class:`Copy` (or a :class:`Hold`) came to, short of a refusal."""

    COPIED = "copied"
    """The broker confirmed the copy."""
    TOO_LARGE = "too-large"
    """The transport says the copy does not fit its size limit; nothing was sent."""
    GONE = "gone"
    """The copy was refused and the delivery can no longer be settled (its channel or
    connection is gone): the broker gives it back."""
    STOPPING = "stopping"
    """Sent for a :class:`Hold`: the edge is stopping; try the copy once more, and give the
    delivery back if that is refused."""


Action: TypeAlias = Ack | Copy | Hold | GiveBack | Stop
Reply: TypeAlias = "bool | CopyResult | CopyRefused | None"
Plan: TypeAlias = Generator[Action, Reply, None]


class Routes(Protocol):
    """Where an edge's copies go (every :class:`~inbox.delivery.transport.Transport` is one)."""

    @property
    def queue(self) -> str:
        """The consumed queue, stream or subject."""
        ...

    @property
    def dead_letters(self) -> str:
        """Where dead letters go: ``<queue>.dlq``."""
        ...

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        """Where a retry copy goes, and how long, in seconds, the edge holds the delivery
        before sending it (0 when the broker itself delays the copy)."""
        ...


class Observer(Protocol):
    """Told of the decision being carried out (telemetry); each method is one branch."""

    def acking(self) -> None:
        """The delivery is to be acked."""

    def halting(self, halt: Halt) -> None:
        """A configuration error stops the edge."""

    def retrying(self, retry: Retry) -> None:
        """A failed try goes to be retried."""

    def dead_lettering(self, dead: DeadLetter) -> None:
        """The delivery goes to the dead letters."""


def plan(
    decision: Decision,
    settling: Settling,
    routes: Routes,
    inbound: Inbound,
    *,
    message: Message | None = None,
    observer: Observer | None = None,
) -> Plan:
    """The actions that carry ``decision`` out for the delivery read as ``inbound`` (and,
    once processed, as ``message``), counted and logged through ``settling``."""
    if isinstance(decision, Ack):
        if observer is not None:
            observer.acking()
        # Ack only now: every handler's claim and effects are committed (or were by an
        # earlier delivery). A crash before the ack means a redelivery, which the inbox
        # skips as a duplicate; acking earlier could lose the message.
        if (yield decision):
            settling.acked()
        return
    if isinstance(decision, Halt):
        if observer is not None:
            observer.halting(decision)
        settling.halt(decision)
        yield from giving_back(settling)
        yield Stop(decision.error)
        return
    if isinstance(decision, Retry):
        if observer is not None:
            observer.retrying(decision)
        added = settling.retry(
            decision,
            message_id=message.id if message is not None else inbound.raw_id,
            message_type=message.type if message is not None else inbound.message_type,
            queue=routes.queue,
            headers=inbound.headers,
        )
        target, hold = routes.retry_route(decision.delay_ms)
        stopping = False
        if hold:
            stopping = (yield Hold(hold)) is CopyResult.STOPPING
        delay = 0 if hold else decision.delay_ms
        yield from _copy(
            settling, routes, inbound, target, added, delay_ms=delay, stopping=stopping
        )
        return
    if observer is not None:
        observer.dead_lettering(decision)
    added = settling.dead_letter(
        decision,
        message_id=inbound.raw_id,
        message_type=inbound.message_type,
        queue=routes.queue,
        dead_letters=routes.dead_letters,
        headers=inbound.headers,
    )
    yield from _copy(
        settling, routes, inbound, routes.dead_letters, added, delay_ms=0, stopping=False
    )


def _copy(
    settling: Settling,
    routes: Routes,
    inbound: Inbound,
    target: str,
    added: dict[str, Any],
    *,
    delay_ms: int,
    stopping: bool,
) -> Plan:
    """The confirmed copy, then the ack; a refused copy is tried again after a hold (or,
    ``stopping``, the delivery is given back); one too large goes to the dead letters
    trimmed."""
    copy = Copy(target, {**inbound.headers, **added}, delay_ms)
    refusals = 0
    while True:
        done = yield copy
        if done is CopyResult.COPIED:
            break
        if done is CopyResult.TOO_LARGE:
            trimmed = settling.too_large(
                message_id=inbound.raw_id,
                target=copy.target,
                dead_letters=routes.dead_letters,
                own=inbound.headers,
                added=added,
            )
            copy = Copy(routes.dead_letters, trimmed, trimmed=True)
            continue
        if done is CopyResult.GONE:
            settling.logger.error(
                "message %s: its channel is gone; the broker gives it back", inbound.raw_id
            )
            return
        if not isinstance(done, CopyRefused):
            raise TypeError(f"a copy is answered with a CopyResult or CopyRefused, got {done!r}")
        if stopping:
            yield from giving_back(settling)
            return
        wait = settling.refused(inbound.raw_id, copy.target, done, refusals)
        refusals += 1
        stopping = (yield Hold(wait)) is CopyResult.STOPPING
    if (yield Ack()):
        settling.acked()


def giving_back(settling: Settling) -> Plan:
    """The plan that gives a delivery back untouched (after a halt, or on a stop)."""
    if (yield GiveBack()):
        settling.stats.requeued += 1
