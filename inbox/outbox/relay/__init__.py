"""The outbox relay: committed outbox rows taken in id order, published with confirms under
their own message ids, then deleted; a refused row is kept and retried later, never dropped
(docs/outbox.md). ``inbox-relay`` is its command (``cli``); ``inbox-worker --relay`` runs it
in a thread beside the worker.
"""

from inbox.outbox.relay._relay import OutboxStatus, Relay, RelayStats, outbox_status

__all__ = ["OutboxStatus", "Relay", "RelayStats", "outbox_status"]
