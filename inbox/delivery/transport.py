"""What a broker edge must do, and the two shells that carry a delivery through the inbox on
it: a new edge is a :class:`Transport` (blocking) or an :class:`AsyncTransport` (asyncio) and
one call to :func:`deliver` / :func:`deliver_async`. It has no policy of its own.

The policy is written once, without I/O, in :mod:`inbox.delivery`: the delivery is read into
a :class:`~inbox.Message` (or the reason it must be dead-lettered), the outcome of
processing becomes a decision (ack, retry, dead letter, halt), and the decision becomes
actions (:func:`inbox.delivery._plan.plan`): ack; a confirmed copy to a retry queue or to
``<queue>.dlq``, then the ack; a hold (keep the delivery, resume later); give back untouched;
stop. The plan also owns a refused copy (held and tried again, the wait doubling to 30 s),
and a copy too large for the broker (sent trimmed to ``<queue>.dlq`` as ``copy-too-large``).
The shells only move the actions to the transport and its answers back to the plan.

An edge's own loop (the kombu worker's batches, say) can drive the plan itself with
:func:`carry_out`, which stops at each :class:`~inbox.delivery._plan.Hold` so that the
delivery can wait without blocking the consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from inbox.delivery._inbound import Inbound, read_inbound
from inbox.delivery._plan import (
    Ack,
    Copy,
    CopyResult,
    GiveBack,
    Hold,
    Observer,
    Plan,
    Reply,
    Routes,
    giving_back,
    plan,
)
from inbox.delivery._policy import DeadLetter, Decision
from inbox.delivery._settling import Settling
from inbox.errors import CopyRefused
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = [
    "AsyncTransport",
    "CopyRefused",
    "Inbound",
    "Transport",
    "carry_out",
    "carry_out_async",
    "deliver",
    "deliver_async",
]

D_contra = TypeVar("D_contra", contravariant=True)
"""The broker library's delivery type (a kombu ``Message``, a FastStream ``StreamMessage``)."""
D = TypeVar("D")


class _Edge(Routes, Protocol[D_contra]):
    """What both kinds of edge do without waiting: where copies go (:class:`Routes`), how a
    delivery reads, whether a copy fits, whether a delivery can still be settled, stop."""

    def read(self, delivery: D_contra) -> Inbound:
        """The delivery's parts: id, type, headers as sent, body as it came, content type
        and encoding, compression."""
        ...

    def fits(self, delivery: D_contra, headers: Mapping[str, Any]) -> bool:
        """Whether the copy with ``headers`` fits the broker's size limit (RabbitMQ's
        ``frame_max`` for the header frame, NATS's max payload; True where there is none)."""
        ...

    def settleable(self, delivery: D_contra) -> bool:
        """Whether the delivery can still be acked (its channel or connection is alive)."""
        ...

    def stop(self, error: BaseException) -> None:
        """A configuration error: stop consuming (the delivery was given back). May raise
        the broker library's own stop signal."""
        ...


class Transport(_Edge[D_contra], Protocol[D_contra]):
    """What a blocking edge does on its broker, for one consumed queue. Every method is
    about one delivery (``delivery``, as the broker library handed it over); none decides
    anything. Besides these three: ``queue``, ``dead_letters``, ``retry_route`` (where a
    retry copy goes and how long, in seconds, the edge holds the delivery first: 0 when the
    broker delays the copy itself), ``read``, ``fits``, ``settleable`` and ``stop``."""

    def ack(self, delivery: D_contra) -> bool:
        """Ack the delivery; False when its channel is gone (the broker gives it back)."""
        ...

    def give_back(self, delivery: D_contra) -> bool:
        """Requeue the delivery untouched; False when its channel is gone."""
        ...

    def copy(
        self, delivery: D_contra, target: str, headers: Mapping[str, Any], *, delay_ms: int
    ) -> None:
        """Send the delivery's body to ``target`` with ``headers`` (all of them) and wait for
        the broker's confirmation; raise :class:`CopyRefused` when it was not taken.
        ``delay_ms``: a retry's delay when the broker delays it without a queue of its own
        (else 0, to ignore)."""
        ...


class AsyncTransport(_Edge[D_contra], Protocol[D_contra]):
    """:class:`Transport` for an asyncio edge: ``ack``, ``give_back`` and ``copy`` are
    awaited; everything else is the same."""

    async def ack(self, delivery: D_contra) -> bool:
        """See :meth:`Transport.ack`."""
        ...

    async def give_back(self, delivery: D_contra) -> bool:
        """See :meth:`Transport.give_back`."""
        ...

    async def copy(
        self, delivery: D_contra, target: str, headers: Mapping[str, Any], *, delay_ms: int
    ) -> None:
        """See :meth:`Transport.copy`."""
        ...


# The shells compare classes with `is` rather than isinstance(): isinstance is a call, and
# the worker's per-delivery calls are budgeted. Actions are final classes.


def carry_out(
    transport: Transport[D], delivery: D, steps: Plan, reply: Reply = None
) -> Hold | None:
    """Carry ``steps`` out on ``transport`` up to its next hold: the :class:`Hold` (the plan
    waits; call again with None when it is due, or with :data:`CopyResult.STOPPING` to not
    wait), or None when the delivery is settled. ``reply`` is sent first (None to start)."""
    try:
        action = steps.send(reply)
        while True:
            kind = action.__class__
            if kind is Ack:
                reply = transport.ack(delivery)
            elif kind is Copy:
                reply = _copy(transport, delivery, action)  # type: ignore[arg-type]
            elif kind is Hold:
                return action  # type: ignore[return-value]
            elif kind is GiveBack:
                reply = transport.give_back(delivery)
            else:
                transport.stop(action.error)  # type: ignore[union-attr]
                reply = None
            action = steps.send(reply)
    except StopIteration:
        return None


def _copy(transport: Transport[D], delivery: D, copy: Copy) -> CopyResult | CopyRefused:
    if not copy.trimmed and not transport.fits(delivery, copy.headers):
        return CopyResult.TOO_LARGE
    try:
        transport.copy(delivery, copy.target, copy.headers, delay_ms=copy.delay_ms)
    except CopyRefused as refused:
        return refused if transport.settleable(delivery) else CopyResult.GONE
    return CopyResult.COPIED


async def carry_out_async(transport: AsyncTransport[D], delivery: D, steps: Plan) -> None:
    """Carry ``steps`` out on ``transport`` to the end, sleeping through each hold."""
    reply: Reply = None
    try:
        while True:
            action = steps.send(reply)
            kind = action.__class__
            if kind is Ack:
                reply = await transport.ack(delivery)
            elif kind is Copy:
                reply = await _copy_async(transport, delivery, action)  # type: ignore[arg-type]
            elif kind is Hold:
                await asyncio.sleep(action.seconds)  # type: ignore[union-attr]
                reply = None
            elif kind is GiveBack:
                reply = await transport.give_back(delivery)
            else:
                transport.stop(action.error)  # type: ignore[union-attr]
                reply = None
    except StopIteration:
        return


async def _copy_async(
    transport: AsyncTransport[D], delivery: D, copy: Copy
) -> CopyResult | CopyRefused:
    if not copy.trimmed and not transport.fits(delivery, copy.headers):
        return CopyResult.TOO_LARGE
    try:
        await transport.copy(delivery, copy.target, copy.headers, delay_ms=copy.delay_ms)
    except CopyRefused as refused:
        return refused if transport.settleable(delivery) else CopyResult.GONE
    return CopyResult.COPIED


def deliver(
    transport: Transport[D],
    delivery: D,
    settling: Settling,
    process: Callable[[Message], ProcessResult],
    *,
    default_content_type: str | None,
    observer: Observer | None = None,
) -> None:
    """One delivery through ``process`` (an :meth:`inbox.Inbox.process`) and to its end on
    ``transport``, counted and logged through ``settling``; a hold sleeps. After a
    configuration error (``settling.halted_by``) every delivery is given back untouched."""
    admitted = _admit(transport, delivery, settling, default_content_type, observer)
    if admitted.__class__ is tuple:
        inbound, message = admitted
        try:
            outcome: ProcessResult | BaseException = process(message)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # any other escape is a failed try, never a dead edge
            outcome = exc
        admitted = _decided(
            settling,
            transport=transport,
            inbound=inbound,
            message=message,
            outcome=outcome,
            observer=observer,
        )
    steps: Plan = admitted  # type: ignore[assignment]
    hold = carry_out(transport, delivery, steps)
    while hold is not None:
        time.sleep(hold.seconds)
        hold = carry_out(transport, delivery, steps)


async def deliver_async(
    transport: AsyncTransport[D],
    delivery: D,
    settling: Settling,
    process: Callable[[Message], Awaitable[ProcessResult]],
    *,
    default_content_type: str | None,
    observer: Observer | None = None,
) -> None:
    """:func:`deliver` for an asyncio edge: ``process`` is awaited (an
    :meth:`inbox.aio.AsyncInbox.process`), holds are ``asyncio.sleep``. A cancellation is
    not decided on: nothing is acked, and the broker gives the delivery back."""
    admitted = _admit(transport, delivery, settling, default_content_type, observer)
    if admitted.__class__ is tuple:
        inbound, message = admitted
        try:
            outcome: ProcessResult | BaseException = await process(message)
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise
        except BaseException as exc:  # any other escape is a failed try, never a dead edge
            outcome = exc
        admitted = _decided(
            settling,
            transport=transport,
            inbound=inbound,
            message=message,
            outcome=outcome,
            observer=observer,
        )
    steps: Plan = admitted  # type: ignore[assignment]
    await carry_out_async(transport, delivery, steps)


def _admit(
    transport: Transport[D] | AsyncTransport[D],
    delivery: D,
    settling: Settling,
    default_content_type: str | None,
    observer: Observer | None,
) -> tuple[Inbound, Message] | Plan:
    """The delivery read, to be processed; or the plan that settles it unprocessed (given
    back after a halt, dead-lettered when it cannot be a message)."""
    if settling.halted_by is not None:
        return giving_back(settling)
    settling.stats.deliveries += 1
    inbound = transport.read(delivery)
    read = read_inbound(inbound, default_content_type)
    if isinstance(read, DeadLetter):
        return plan(read, settling, transport, inbound, observer=observer)
    return inbound, read


def _decided(
    settling: Settling,
    *,
    transport: Transport[D] | AsyncTransport[D],
    inbound: Inbound,
    message: Message,
    outcome: ProcessResult | BaseException,
    observer: Observer | None,
) -> Plan:
    decision: Decision = settling.decide(message.id, outcome, inbound.headers)
    return plan(decision, settling, transport, inbound, message=message, observer=observer)
