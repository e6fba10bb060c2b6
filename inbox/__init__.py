"""inbox: a transactional inbox for SQLAlchemy 2 — exactly-once database effects on
at-least-once brokers.

Register handlers with ``@inbox.handler``, then call ``inbox.process(message)`` for every
delivery: each (message, handler) pair commits its database effects once and only once.
"""

from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names
from inbox.core import Inbox
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
    "HandlerInterrupted",
    "Inbox",
    "InboxError",
    "InvalidBody",
    "InvalidKey",
    "InvalidMessage",
    "Message",
    "Outbox",
    "Outcome",
    "ProcessResult",
    "PublishError",
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

_INTERNAL = "the handler records' types are internal (annotate handlers with Message and Session)"
# Hidden from type checkers: a module __getattr__ would make mypy accept any attribute of this
# module (a typo included); a deprecated name is then a type error, which is what it should be.
if not TYPE_CHECKING:
    __getattr__ = deprecated_names(
        __name__,
        dict.fromkeys(
            ("HandlerFunc", "KeyFunc", "RegisteredHandler"), ("inbox.core._handlers", _INTERNAL)
        ),
    )
