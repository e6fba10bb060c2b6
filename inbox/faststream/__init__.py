"""The FastStream broker edge: FastStream subscribers that run each delivery through an
:class:`inbox.aio.AsyncInbox` and ack only after it committed.

The kombu worker's decisions, retry schedule, queue layout and ``x-inbox-*`` headers are
shared, not copied (docs/faststream.md). Needs the ``faststream`` extra
(``pip install 'sqlalchemy-inbox[faststream]'``); ``import inbox`` and ``import inbox.aio`` do
not load FastStream.
"""

from inbox.faststream._nats import subscribe_nats_stream
from inbox.faststream._rabbit import subscribe_rabbit
from inbox.faststream._redis import subscribe_redis_stream
from inbox.faststream._subscription import InboxSubscription

__all__ = [
    "InboxSubscription",
    "subscribe_nats_stream",
    "subscribe_rabbit",
    "subscribe_redis_stream",
]
