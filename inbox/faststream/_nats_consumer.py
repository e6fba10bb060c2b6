"""What the NATS edge keeps on JetStream beside the consumed stream: the durable consumer's
``max_deliver`` checked against the retry policy before the first delivery is processed,
and each retried message's failure history in a key-value bucket.

A retry on JetStream is a ``NAK`` with a delay: the message is not copied, so the headers a
retry copy carries on RabbitMQ (``x-inbox-first-failure``, ``-last-failure``, ``-error``,
``-failed-handlers``) would be lost and a dead letter's "first failure" would be its last.
They are written to the bucket ``<stream>_inbox_retries`` under ``<durable>.<stream
sequence>``, confirmed by JetStream before the ``NAK`` (a refused write is a refused copy:
the delivery is held and the write tried again), read back when the message is delivered
again (a value that is not a JSON object is ignored with a warning), and purged once it
is acked or dead-lettered. The bucket's TTL removes what a purge missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Final

from faststream.nats import NatsBroker
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from inbox.delivery import headers as h
from inbox.errors import ConfigurationError, CopyRefused

__all__ = ["HISTORY_HEADERS", "RetryHistory", "ensure_max_deliver", "history_bucket"]

logger = logging.getLogger("inbox.faststream")

HISTORY_HEADERS: Final = (h.FIRST_FAILURE, h.LAST_FAILURE, h.ERROR, h.FAILED_HANDLERS)
"""The headers a retry keeps for the next delivery (the tries are JetStream's own count)."""
HISTORY_TTL: Final = 7 * 24 * 3600.0
"""Seconds a failure history outlives a purge that never came (a consumer that died)."""
_NOT_A_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")


def history_bucket(stream: str) -> str:
    """The key-value bucket that keeps the retry history of ``stream``'s messages."""
    return f"{_NOT_A_NAME.sub('_', stream)}_inbox_retries"


class RetryHistory:
    """The failure headers of the messages ``durable`` retries, one key per stream
    sequence (see the module)."""

    def __init__(self, broker: NatsBroker, stream: str, durable: str, replicas: int) -> None:
        self.broker = broker
        self.bucket = history_bucket(stream)
        self.prefix = _NOT_A_NAME.sub("_", durable)
        self.replicas = replicas
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()

    async def _store(self) -> KeyValue:
        if self._kv is None:
            async with self._lock:
                if self._kv is None:
                    self._kv = await self.broker.key_value(
                        self.bucket, ttl=HISTORY_TTL, replicas=self.replicas
                    )
        return self._kv

    def _key(self, sequence: int) -> str:
        return f"{self.prefix}.{sequence}"

    async def remember(self, sequence: int, headers: Mapping[str, Any]) -> None:
        """Keep the failure headers of a retry, confirmed; :class:`CopyRefused` if not."""
        kept = {name: str(headers[name]) for name in HISTORY_HEADERS if name in headers}
        try:
            kv = await self._store()
            await kv.put(self._key(sequence), json.dumps(kept).encode())
        except (NatsError, ConnectionError, TimeoutError) as exc:
            raise CopyRefused(f"keeping the retry history: {type(exc).__name__}: {exc}") from exc

    async def recall(self, sequence: int) -> dict[str, str]:
        """The failure headers kept for the message at ``sequence`` ({} when none are)."""
        try:
            kv = await self._store()
            entry = await kv.get(self._key(sequence))
        except KeyNotFoundError:
            return {}
        except (NatsError, ConnectionError, TimeoutError) as exc:
            # The message itself is not at stake: only what its dead letter will say.
            logger.warning(
                "stream sequence %d: its retry history could not be read (%s: %s)",
                sequence,
                type(exc).__name__,
                exc,
            )
            return {}
        problem: str | None
        try:
            kept = json.loads(entry.value or b"{}")
        except ValueError as exc:  # not JSON, or not UTF-8
            problem = f"{type(exc).__name__}: {exc}"
        else:
            problem = None if isinstance(kept, dict) else f"a JSON {type(kept).__name__}"
        if problem is not None:
            # Not written by this edge: only what the dead letter says is at stake.
            logger.warning(
                "stream sequence %d: its retry history in %s is not a JSON object (%s); "
                "going on without it",
                sequence,
                self.bucket,
                problem,
            )
            return {}
        return {str(k): str(v) for k, v in kept.items() if k in HISTORY_HEADERS}

    async def forget(self, sequence: int) -> None:
        """Purge the history of a message that was acked or dead-lettered (the TTL removes
        it when this fails)."""
        try:
            kv = await self._store()
            await kv.purge(self._key(sequence))
        except (NatsError, ConnectionError, TimeoutError) as exc:
            logger.warning(
                "stream sequence %d: its retry history stays until the bucket's TTL (%s: %s)",
                sequence,
                type(exc).__name__,
                exc,
            )


async def ensure_max_deliver(
    broker: NatsBroker, stream: str, durable: str, *, wanted: int, max_tries: int
) -> bool:
    """Raise the durable consumer's ``max_deliver`` to ``wanted`` when it is lower.

    ``pull_subscribe`` only looks an existing durable up, so a consumer made by an earlier
    deployment keeps its own ``max_deliver``: below ``max_tries`` JetStream would stop
    delivering a failing message before the edge dead-letters it. Raises
    :class:`~inbox.ConfigurationError` (one line naming the consumer and the settings) when
    the consumer is below ``max_tries`` and cannot be updated. False (and a warning) when
    the consumer could not be looked up: the check is to be made again.
    """
    js = broker.connection.jetstream()
    try:
        info = await js.consumer_info(stream, durable)
    except (NatsError, ConnectionError, TimeoutError) as exc:
        logger.warning(
            "consumer %r of stream %r: its max_deliver could not be checked (%s: %s); "
            "checking again on the next delivery",
            durable,
            stream,
            type(exc).__name__,
            exc,
        )
        return False
    current = info.config.max_deliver
    if current is None or current <= 0 or current >= wanted:
        return True  # unlimited (-1), or enough
    info.config.max_deliver = wanted
    try:
        await js.add_consumer(stream, info.config)
    except (NatsError, ConnectionError, TimeoutError) as exc:
        if current >= max_tries:
            logger.warning(
                "consumer %r of stream %r keeps max_deliver=%d (could not raise it to %d: %s)",
                durable,
                stream,
                current,
                wanted,
                exc,
            )
            return True
        raise ConfigurationError(
            f"consumer {durable!r} of stream {stream!r} has max_deliver={current}, below the "
            f"retry policy's max_tries={max_tries}, and could not be raised to {wanted}: {exc}"
        ) from exc
    logger.warning(
        "consumer %r of stream %r: max_deliver raised from %d to %d (retry policy max_tries=%d)",
        durable,
        stream,
        current,
        wanted,
        max_tries,
    )
    return True
