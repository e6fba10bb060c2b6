"""The names the inbox records under: instruments, span names, attribute keys.

OpenTelemetry's messaging semantic conventions where they apply (``messaging.*``,
``error.type``); the inbox's own names under ``inbox.*`` for what they do not cover. A
Prometheus exporter turns dots into underscores and appends the unit and ``_total``:
``inbox.processed`` is scraped as ``inbox_processed_total``, ``inbox.handler.duration`` as
``inbox_handler_duration_seconds``.
"""

from __future__ import annotations

from typing import Final

SCOPE: Final = "inbox"
"""The instrumentation scope of every meter and tracer the inbox uses."""

# Counters, per handler and message type.
PROCESSED: Final = "inbox.processed"
DUPLICATES: Final = "inbox.duplicates"
FAILURES: Final = "inbox.failures"
RETRIES: Final = "inbox.retries"
DEAD_LETTERS: Final = "inbox.dead_letters"
EFFECTS: Final = "inbox.effects"
OUTBOX_SENT: Final = "inbox.outbox.sent"
OUTBOX_REFUSED: Final = "inbox.outbox.refused"
CONSUMED: Final = "messaging.client.consumed.messages"

# Gauges read at scrape time (inbox-worker --metrics-port, telemetry/_gauges.py).
WORKER_READY: Final = "inbox.worker.ready"
OUTBOX_PENDING: Final = "inbox.outbox.pending"
OUTBOX_OLDEST_AGE: Final = "inbox.outbox.oldest.age"

# Histograms, in seconds.
CLAIM_DURATION: Final = "inbox.claim.duration"
HANDLER_DURATION: Final = "inbox.handler.duration"
MESSAGE_AGE: Final = "inbox.message.age"
PROCESS_DURATION: Final = "messaging.process.duration"

# Attribute keys.
HANDLER: Final = "inbox.handler"
MESSAGE_TYPE: Final = "inbox.message.type"
OUTCOME: Final = "inbox.outcome"
DECISION: Final = "inbox.decision"
REASON: Final = "inbox.dead_letter.reason"
TRIES: Final = "inbox.tries"
STEP: Final = "inbox.effect.step"
ERROR_TYPE: Final = "error.type"
SYSTEM: Final = "messaging.system"
OPERATION_NAME: Final = "messaging.operation.name"
OPERATION_TYPE: Final = "messaging.operation.type"
DESTINATION: Final = "messaging.destination.name"
MESSAGE_ID: Final = "messaging.message.id"
CONVERSATION_ID: Final = "messaging.message.conversation_id"
BODY_SIZE: Final = "messaging.message.body.size"
ROUTING_KEY: Final = "messaging.rabbitmq.destination.routing_key"
BATCH_SIZE: Final = "messaging.batch.message_count"

SECONDS_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
"""Claim and handler times: half a millisecond to a minute."""
AGE_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
)  # fmt: skip
"""End-to-end age: from 5 ms (a local broker) to a day (a backlog, a replayed dead letter)."""
