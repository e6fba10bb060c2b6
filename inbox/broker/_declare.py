"""The worker's queues declared through kombu: each :class:`~inbox.delivery.topology.QueueSpec`
as a kombu ``Queue``, and the declaration that keeps an older version's consumed queue."""

from __future__ import annotations

import logging
import re
from typing import Final

from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from inbox.delivery.topology import QueueSpec, QueueTopology

__all__ = ["declare_topology", "kombu_queue"]

_PRECONDITION_FAILED: Final = 406
_DEAD_LETTER_ARG: Final = r"inequivalent arg 'x-dead-letter-(exchange|routing-key)'"

logger = logging.getLogger("inbox.worker")


def kombu_queue(spec: QueueSpec) -> Queue:
    """``spec`` as a durable kombu queue on the default exchange."""
    return Queue(
        spec.name,
        exchange=Exchange(""),
        routing_key=spec.name,
        durable=True,
        auto_delete=False,
        queue_arguments=dict(spec.arguments) or None,
    )


def declare_topology(connection: Connection, topology: QueueTopology, *, passive: bool) -> None:
    """Declare every queue of ``topology`` (or, with ``passive``, check that it exists) on
    channels of its own: a refused declaration closes the channel it was made on.

    A consumed queue that exists with other arguments (declared by an older version) is
    kept as it is and checked passively, with a warning; any other refusal is raised.
    """
    channel = connection.channel()
    try:
        for spec in topology.queues():
            queue = kombu_queue(spec)
            if passive:
                queue(channel).queue_declare(passive=True)
                continue
            try:
                queue(channel).declare()
            except connection.channel_errors as exc:
                if queue.name != topology.name or not _only_dead_lettering_differs(exc):
                    raise
                channel = connection.channel()  # the refusal closed the other one
                queue(channel).queue_declare(passive=True)
                logger.warning(
                    "queue %s exists with other arguments than this version declares (%s); "
                    "kept as it is. To dead-letter what RabbitMQ drops from it, apply a "
                    "policy: rabbitmqctl set_policy %s-dlx '^%s$' "
                    '\'{"dead-letter-exchange":"","dead-letter-routing-key":"%s"}\' '
                    "--apply-to queues",
                    queue.name,
                    exc,
                    queue.name,
                    queue.name.replace(".", "\\."),
                    topology.dead_letter_queue,
                )
    finally:
        channel.close()


def _only_dead_lettering_differs(exc: BaseException) -> bool:
    # RabbitMQ names the first argument that differs; another type or TTL stays refused.
    code = getattr(exc, "reply_code", None) or getattr(exc, "code", None)
    text = str(getattr(exc, "reply_text", None) or exc)
    return code == _PRECONDITION_FAILED and re.search(_DEAD_LETTER_ARG, text) is not None
