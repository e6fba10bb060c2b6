"""A batch's acks as ONE ``basic.ack`` with ``multiple=True``, where that acks exactly them.

``basic.ack(tag, multiple=True)`` acks every unacked delivery on the channel up to ``tag``.
That is the batch's own acks only when no other delivery at or below ``tag`` is still
unsettled, so :class:`AckTracker` follows each channel's delivery tags (they count 1, 2, 3…
per channel) and allows the multiple ack only when

* every tag up to ``tag`` was settled before (acked, copied then acked, or given back) or
  belongs to this batch, whose other deliveries are settled by now: the tags seen so far
  run without a gap from 1, and this batch's continue them without a gap;
* the worker holds no delivery unacked for later (a retry held where the transport has no
  delay queues, or a copy the broker refused): it could sit below ``tag``;
* the transport is RabbitMQ (AMQP's multiple ack; other kombu transports ack one by one).

Anywhere else (a delivery the worker never settled, a gap, a new channel) the acks go one
by one, as without this module: the rule only ever saves frames, never acks more.

One delivery at a time, the worker holds the acks of committed deliveries back while more
are at hand (up to a quarter of the prefetch, see :class:`~inbox.broker._dispatch.Dispatcher`)
and sends them with :meth:`AckTracker.ack_settled`: the same rule, for deliveries whose tags
were recorded as settled when they were decided. An ack is still only ever sent after its
delivery's commit; a crash before it redelivers those deliveries, which are duplicates.
"""

from __future__ import annotations

from collections.abc import Sequence

from kombu.message import Message as Delivery

__all__ = ["AckTracker"]


class AckTracker:
    """Which tags of the current channel are settled, and the acks of a batch."""

    def __init__(self, *, multiple: bool) -> None:
        self._multiple = multiple
        self._channel: object | None = None
        self._through = 0
        """Every delivery tag <= this on ``_channel`` is settled; -1: a gap was seen."""
        self.multiple_acks = 0
        """How many ``multiple=True`` acks were sent (for tests and stats)."""

    def settled(self, deliveries: Sequence[Delivery]) -> None:
        """``deliveries`` (taken together, all from one dispatch) are settled now."""
        self._tags(deliveries)

    def ack(self, batch: Sequence[Delivery], to_ack: Sequence[Delivery], holding: int) -> None:
        """Ack ``to_ack``, the part of ``batch`` decided "ack" (the rest of ``batch`` is
        settled already): one multiple ack when the rule above allows, else one by one."""
        contiguous = self._tags(batch)
        if not (contiguous and self._multiple and holding == 0 and to_ack):
            for delivery in to_ack:
                delivery.ack()
            return
        # Every tag up to the highest one acked is this batch's or settled before: one frame.
        max(to_ack, key=_tag).ack(multiple=True)
        self.multiple_acks += 1

    def ack_settled(self, to_ack: Sequence[Delivery], holding: int) -> None:
        """Ack ``to_ack``, deliveries decided "ack" and recorded by :meth:`settled` whose
        acks were held back: one multiple ack when every tag up to the highest of them is
        settled and nothing is held, else one by one."""
        if not to_ack:
            return
        last = max(to_ack, key=_tag)
        channel = self._channel
        if (
            self._multiple
            and holding == 0
            and 0 < _tag(last) <= self._through
            and all(delivery.channel is channel for delivery in to_ack)
        ):
            last.ack(multiple=True)
            self.multiple_acks += 1
            return
        for delivery in to_ack:
            delivery.ack()

    def _tags(self, deliveries: Sequence[Delivery]) -> bool:
        """Whether ``deliveries`` continue the settled run of tags of their channel without
        a gap; records them as settled (or the channel as having a gap)."""
        if not deliveries:
            return False
        if len(deliveries) == 1:  # one delivery at a time: no sort, no generator
            return self._tag_one(deliveries[0])
        channel = deliveries[0].channel
        if channel is not self._channel:
            self._channel, self._through = channel, 0
        tags = sorted(_tag(d) for d in deliveries)
        start = self._through + 1
        if self._through < 0 or any(d.channel is not channel for d in deliveries):
            self._through = -1
            return False
        if tags != list(range(start, start + len(tags))):
            self._through = -1
            return False
        self._through = tags[-1]
        return True

    def _tag_one(self, delivery: Delivery) -> bool:
        """:meth:`_tags` of one delivery."""
        channel = delivery.channel
        if channel is not self._channel:
            self._channel, self._through = channel, 0
        tag = delivery.delivery_tag
        if self._through < 0 or tag != self._through + 1 or not isinstance(tag, int):
            self._through = -1
            return False
        self._through = tag
        return True


def _tag(delivery: Delivery) -> int:
    tag = delivery.delivery_tag
    return tag if isinstance(tag, int) else -1
