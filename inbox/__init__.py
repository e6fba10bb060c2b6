"""inbox: a transactional inbox for SQLAlchemy 2 — exactly-once database effects on
at-least-once brokers.

Register handlers with ``@inbox.handler``, then call ``inbox.process(message)`` for every
delivery: each (message, handler) pair commits its database effects once and only once.
"""

from inbox.core import Inbox
from inbox.core._handlers import HandlerFunc, KeyFunc, RegisteredHandler
from inbox.core.effects._identity import EffectMode
from inbox.errors import (
    ClaimCommittedEarly,
    ConfigurationError,
    CopyRefused,
    EffectError,
    HandlerFailed,
    HandlerInterrupted,
    InboxError,
    InvalidBody,
    InvalidKey,
    InvalidMessage,
    PublishError,
    RegistrationError,
    SessionConfigurationError,
    TransactionControlError,
    UncertainEffect,
    UndecodableBody,
    UnhandledMessage,
    UnsupportedDialect,
)
from inbox.message import IDEMPOTENCY_KEY_HEADER, KEY_NAMESPACE, Message, uuid7
from inbox.outbox import Outbox
from inbox.result import Outcome, ProcessResult, Unhandled
from inbox.retention import CleanupReport, cleanup

__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "KEY_NAMESPACE",
    "ClaimCommittedEarly",
    "CleanupReport",
    "ConfigurationError",
    "CopyRefused",
    "EffectError",
    "EffectMode",
    "HandlerFailed",
    "HandlerFunc",
    "HandlerInterrupted",
    "Inbox",
    "InboxError",
    "InvalidBody",
    "InvalidKey",
    "InvalidMessage",
    "KeyFunc",
    "Message",
    "Outbox",
    "Outcome",
    "ProcessResult",
    "PublishError",
    "RegisteredHandler",
    "RegistrationError",
    "SessionConfigurationError",
    "TransactionControlError",
    "UncertainEffect",
    "UndecodableBody",
    "Unhandled",
    "UnhandledMessage",
    "UnsupportedDialect",
    "cleanup",
    "uuid7",
]
