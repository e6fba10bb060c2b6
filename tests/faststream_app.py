"""The FastStream app test_faststream_stop.py runs in subprocesses: ``subscribe_rabbit`` with an
AsyncInbox on PostgreSQL (asyncpg), run by ``FastStream.run()`` (which stops cleanly on
SIGTERM and SIGINT). One handler, ``ops.apply`` for type ``op``, inserts one effects row.

Configured by the environment (test hooks, not library features):

* ``FS_APP_DATABASE_URL`` (required): the blocking URL of the test database.
* ``FS_APP_AMQP_URL``, ``FS_APP_QUEUE`` (required): the broker and the queue to consume.
* ``FS_APP_STARTED_FILE``: a line with the ref is appended when a handler starts.
* ``FS_APP_SLOW``: seconds the handler sleeps after inserting its effect.
"""

from __future__ import annotations

import asyncio
import logging
import os

from faststream import FastStream
from faststream.rabbit import RabbitBroker
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from support.aio import async_url, record_effect

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.faststream import subscribe_rabbit


async def main() -> None:
    url, connect_args = async_url(os.environ["FS_APP_DATABASE_URL"], "asyncpg")
    engine = create_async_engine(url, connect_args=connect_args)
    inbox = AsyncInbox(async_sessionmaker(engine))
    slow = float(os.environ.get("FS_APP_SLOW") or 0)
    started = os.environ.get("FS_APP_STARTED_FILE")

    @inbox.handler("op", name="ops.apply")
    async def apply(message: Message, session: AsyncSession) -> None:
        if started:
            with open(started, "a") as out:
                out.write(f"{message.body['ref']}\n")
        await record_effect(message, session, "ops.apply")
        await asyncio.sleep(slow)

    broker = RabbitBroker(os.environ["FS_APP_AMQP_URL"], graceful_timeout=20.0)
    subscription = subscribe_rabbit(broker, inbox, os.environ["FS_APP_QUEUE"], prefetch=16)
    app = FastStream(broker)
    try:
        await app.run()
    finally:
        await engine.dispose()
        logging.getLogger("inbox.faststream").warning("stopped: %s", subscription.stats.summary())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
