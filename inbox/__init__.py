"""inbox: a transactional inbox for SQLAlchemy 2 — exactly-once database effects on
at-least-once brokers.

Register handlers with ``@inbox.handler``, then call ``inbox.process(message)`` for every
delivery: each (message, handler) pair commits its database effects once and only once.
"""

from inbox.core import Inbox
from inbox.errors import (
    HandlerFailed,
    InboxError,
    InvalidKey,
    InvalidMessage,
    PublishError,
    RegistrationError,
    SessionConfigurationError,
    TransactionControlError,
    UnhandledMessage,
    UnsupportedDialect,
)
from inbox.message import IDEMPOTENCY_KEY_HEADER, KEY_NAMESPACE, Message, uuid7
from inbox.result import Outcome, ProcessResult, Unhandled
from inbox.retention import CleanupReport, cleanup

__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "KEY_NAMESPACE",
    "CleanupReport",
    "HandlerFailed",
    "Inbox",
    "InboxError",
    "InvalidKey",
    "InvalidMessage",
    "Message",
    "Outcome",
    "ProcessResult",
    "PublishError",
    "RegistrationError",
    "SessionConfigurationError",
    "TransactionControlError",
    "Unhandled",
    "UnhandledMessage",
    "UnsupportedDialect",
    "cleanup",
    "uuid7",
]
