"""How many rows one batch of a cleanup deletes: a fixed number, or as many as fit a time
budget, sized from the rate the previous batches achieved; and how long to pause after it,
a fixed time or a multiple of the batch's own measured time (:class:`BatchSizing`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_BATCH_SECONDS",
    "FIRST_ADAPTIVE_BATCH",
    "MAX_ADAPTIVE_BATCH",
    "MIN_ADAPTIVE_BATCH",
    "BatchSizing",
]

DEFAULT_BATCH_SECONDS: Final = 0.025
"""The time budget of one batch when its size adapts (``batch_size`` not given)."""
FIRST_ADAPTIVE_BATCH: Final = 2_000
"""The first batch's rows when the size adapts: small enough for any server."""
MIN_ADAPTIVE_BATCH: Final = 100
MAX_ADAPTIVE_BATCH: Final = 100_000
"""The bounds of an adapted batch: the largest keeps the rows locked at once (which a
redelivery of an expired message may wait for) bounded however fast the server is."""
_GROWTH: Final = 2.0  # a batch at most twice the previous one: one fast batch proves little
_SMOOTHING: Final = 0.5  # weight of the newest batch in the seconds-per-row estimate


@dataclass(slots=True)
class BatchSizing:
    """The number of rows of each batch: ``fixed`` rows, or sized to take ``seconds``.

    The adaptive size follows the seconds per row measured on whole batch transactions
    (statement and commit), smoothed over the recent batches: ``seconds`` over that, at
    most twice the previous batch, at least :data:`MIN_ADAPTIVE_BATCH`, at most ``most``
    (:data:`MAX_ADAPTIVE_BATCH`), rounded to two significant digits. A batch that took longer
    than its budget shrinks the next one at once (the estimate moves halfway to it).
    """

    fixed: int | None = None
    seconds: float = DEFAULT_BATCH_SECONDS
    most: int = MAX_ADAPTIVE_BATCH
    """The largest batch, fixed or adapted."""
    pause: float = 0.0
    """Seconds to sleep between two batches of a table, leaving the server to the workers."""
    pause_ratio: float = 0.0
    """After each batch, sleep this many times as long as the batch took (the longer of
    this and ``pause``): the purge keeps the server busy a fixed share of the time however
    slow the batches get on a loaded server."""
    _size: int = 0
    _per_row: float | None = None
    _pause: float = 0.0

    def __post_init__(self) -> None:
        first = self.fixed if self.fixed is not None else FIRST_ADAPTIVE_BATCH
        self._size = min(first, self.most)
        self._pause = self.pause

    @property
    def next_pause(self) -> float:
        """Seconds to sleep before the next batch: ``pause``, or ``pause_ratio`` times the
        last batch's seconds when that is longer."""
        return self._pause

    @property
    def size(self) -> int:
        """The rows of the next batch."""
        return self._size

    def record(self, rows: int, seconds: float) -> None:
        """A batch deleted ``rows`` in ``seconds`` (its whole transaction): size the next
        one and the pause before it."""
        self._pause = max(self.pause, self.pause_ratio * seconds)
        if self.fixed is not None or rows <= 0 or seconds <= 0:
            return
        per_row = seconds / rows
        if self._per_row is None:
            self._per_row = per_row
        else:
            self._per_row += _SMOOTHING * (per_row - self._per_row)
        wanted = self.seconds / self._per_row
        wanted = min(wanted, self._size * _GROWTH, self.most)
        self._size = _two_digits(max(MIN_ADAPTIVE_BATCH, int(wanted)))


def _two_digits(rows: int) -> int:
    """``rows`` rounded down to two significant digits (few distinct statements)."""
    scale = int(10 ** max(0, int(math.log10(rows)) - 1))
    return rows // scale * scale
