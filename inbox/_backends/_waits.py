"""Driving a protocol that waits on a socket, blocking or awaited.

A protocol step is a generator that does no waiting itself: it yields what it waits for
(:data:`READ`, or :data:`READ_WRITE` while its output is not all sent) and is resumed once
the socket is ready. :func:`drive` resumes it from blocking code, :func:`drive_async` from a
coroutine: the protocol is written once, only the waiting differs (psycopg drives its own
generators the same way).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Generator
from typing import Final, TypeAlias, TypeVar

__all__ = ["READ", "READ_WRITE", "Protocol", "drive", "drive_async"]

T = TypeVar("T")

READ: Final = 1
"""Wait until the socket can be read."""
READ_WRITE: Final = 3
"""Wait until the socket can be read or written."""

Protocol: TypeAlias = Generator[int, None, T]
"""A protocol step: yields what it waits for, returns its value."""

_POLL_EVENTS: Final = {READ: select.POLLIN, READ_WRITE: select.POLLIN | select.POLLOUT}


def drive(protocol: Protocol[T], fileno: int) -> T:
    """Run ``protocol`` to its end, blocking on ``fileno`` whenever it waits."""
    poll = select.poll()
    try:
        wait = next(protocol)
        while True:
            poll.register(fileno, _POLL_EVENTS[wait])
            poll.poll()
            wait = protocol.send(None)
    except StopIteration as finished:
        value: T = finished.value
        return value


async def drive_async(protocol: Protocol[T], fileno: int) -> T:
    """Run ``protocol`` to its end, awaiting ``fileno`` on the running loop whenever it waits."""
    loop = asyncio.get_running_loop()
    try:
        wait = next(protocol)
        while True:
            ready = loop.create_future()
            loop.add_reader(fileno, _wake, ready)
            if wait == READ_WRITE:
                loop.add_writer(fileno, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(fileno)
                if wait == READ_WRITE:
                    loop.remove_writer(fileno)
            wait = protocol.send(None)
    except StopIteration as finished:
        value: T = finished.value
        return value


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
