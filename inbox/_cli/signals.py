"""SIGTERM and SIGINT for a worker: the first stops it cleanly, the second at once."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Protocol

__all__ = ["install_signal_handlers"]

logger = logging.getLogger("inbox.worker")


class _Stoppable(Protocol):
    def stop(self) -> None: ...


def install_signal_handlers(worker: _Stoppable) -> None:
    """Make SIGTERM and SIGINT stop ``worker`` cleanly: the deliveries in hand are finished
    and acked, then the worker returns. A second signal stops at once (the in-flight
    delivery is rolled back and redelivered). Call from the main thread."""

    def first(signum: int, frame: FrameType | None) -> None:
        logger.info(
            "%s: finishing the deliveries in hand, then stopping", signal.Signals(signum).name
        )
        worker.stop()
        signal.signal(signal.SIGTERM, second)
        signal.signal(signal.SIGINT, second)

    def second(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")

    signal.signal(signal.SIGTERM, first)
    signal.signal(signal.SIGINT, first)
