"""A process for the async concurrency test: several tasks deliver the same messages as the
other processes' tasks, through one AsyncInbox.

Usage: python aio_concurrent_worker.py ASYNC_URL CONNECT_ARGS_JSON START_AT TASKS ID [ID ...]

Waits until the wall clock reaches START_AT (so all processes start together), runs TASKS
tasks that each process every message in its own shuffled order, and prints one JSON line:
outcome counts and any errors.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from support.databases import effects

from inbox import Message
from inbox.aio import AsyncInbox


async def main(argv: list[str]) -> int:
    url, connect_args, start_at, tasks, *ids = argv
    engine = create_async_engine(url, connect_args=json.loads(connect_args), pool_size=int(tasks))
    inbox = AsyncInbox(async_sessionmaker(engine))

    @inbox.handler("order.created", name="billing.charge")
    async def charge(message: Message, session: AsyncSession) -> None:
        await session.execute(insert(effects).values(ref=str(message.id), handler="billing.charge"))
        await asyncio.sleep(0.001)  # widen the window in which peers collide on the claim

    messages = [Message(id=i, type="order.created", body={}) for i in ids]
    outcomes: Counter[str] = Counter()
    errors: list[str] = []

    async def deliver(seed: int) -> None:
        mine = list(messages)
        random.Random(seed).shuffle(mine)
        for message in mine:
            try:
                outcomes[(await inbox.process(message)).outcome.value] += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    async with engine.connect():
        pass  # connect before the start line, so the race is on the claims, not on connecting
    await asyncio.sleep(max(0.0, float(start_at) - time.time()))
    await asyncio.gather(*(deliver(seed) for seed in range(int(tasks))))
    print(json.dumps({"outcomes": outcomes, "errors": errors}))
    await engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
