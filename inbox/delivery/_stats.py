"""The worker's counters: what happened to deliveries, and to handler runs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["WorkerStats"]


@dataclass
class WorkerStats:
    """Counters since the worker started; logged periodically and when it stops.

    Per delivery (one AMQP message taken from a queue): ``deliveries`` received,
    ``acked`` (every delivery that left the queue: processed, retried or dead-lettered),
    ``failed_tries``, ``retried``, ``dead_lettered`` (by reason in ``dead_letter_reasons``),
    ``requeued`` (given back untouched: a configuration error, or a copy that could not be
    sent on a stop). Per handler run (one message fans out to each handler of its type):
    ``processed`` (committed), ``duplicates`` (skipped: already committed before).
    """

    deliveries: int = 0
    acked: int = 0
    processed: int = 0
    duplicates: int = 0
    failed_tries: int = 0
    retried: int = 0
    dead_lettered: int = 0
    requeued: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def requeued_on_stop(self) -> int:
        """Former name of :attr:`requeued`."""
        return self.requeued

    def summary(self) -> str:
        """One line with every counter, per-delivery counts first."""
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.dead_letter_reasons.items()))
        return (
            f"deliveries={self.deliveries} acked={self.acked} failed_tries={self.failed_tries} "
            f"retried={self.retried} dead_lettered={self.dead_lettered}"
            + (f" ({reasons})" if reasons else "")
            + f" requeued={self.requeued}; handler runs: processed={self.processed} "
            f"duplicates={self.duplicates}"
        )
