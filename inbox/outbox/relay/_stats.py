"""The relay's counters."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RelayStats"]


@dataclass
class RelayStats:
    """Counters since the relay started; logged periodically and when it stops.

    ``batches`` taken from the table; ``published``: rows the broker confirmed and the relay
    deleted; ``refused``: refusals (a row refused three times counts three; each stays in the
    table with its error and a later next attempt); ``resent``: rows the broker had confirmed
    but whose delete the relay could not confirm (a lost or failed COMMIT, a deadlock): they
    go out again under the same message id, so they may reach the broker twice;
    ``unconfirmed``: rows published whose confirm never came (the broker connection broke, or
    a channel closed under them): they go out again too, and may have arrived already;
    ``broker_reconnects`` and ``database_errors``: failures the relay recovered from.
    """

    batches: int = 0
    published: int = 0
    refused: int = 0
    resent: int = 0
    unconfirmed: int = 0
    broker_reconnects: int = 0
    database_errors: int = 0

    def summary(self) -> str:
        """One line with every counter."""
        return (
            f"batches={self.batches} published={self.published} refused={self.refused} "
            f"resent={self.resent} unconfirmed={self.unconfirmed} "
            f"broker_reconnects={self.broker_reconnects} database_errors={self.database_errors}"
        )
