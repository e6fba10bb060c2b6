"""The exception hierarchy: every error the library raises is an :class:`InboxError`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inbox.result import ProcessResult

__all__ = [
    "ClaimCommittedEarly",
    "ConfigurationError",
    "CopyRefused",
    "EffectError",
    "HandlerFailed",
    "HandlerInterrupted",
    "InboxError",
    "InvalidBody",
    "InvalidKey",
    "InvalidMessage",
    "PublishError",
    "RegistrationError",
    "SessionConfigurationError",
    "TransactionControlError",
    "UncertainEffect",
    "UndecodableBody",
    "UnhandledMessage",
    "UnsupportedDialect",
]


class InboxError(Exception):
    """Root of every exception raised by the inbox library."""


class ConfigurationError(InboxError, TypeError, ValueError):
    """The library was given something it cannot use: a bad argument, option or registration.

    Raised where the call is made (a constructor, a decorator, an option, a CLI flag), before
    anything runs or is committed. It is a :class:`TypeError` and a :class:`ValueError` too,
    so code written against the builtin errors the library raised before keeps working.
    """


class InvalidMessage(InboxError, ValueError):
    """A message cannot be processed as given: no id, an id that is not a UUID, a bad header."""


class InvalidBody(InvalidMessage):
    """A message's body does not validate as the ``body=`` type of a handler that takes it.

    Raised by ``process()`` before any claim, so nothing of the message was committed; the
    worker dead-letters it at once (``invalid-body``). ``reason`` names the fields and what
    was wrong with them, never their values.
    """

    def __init__(self, handler: str, message_id: uuid.UUID, body_type: str, reason: str) -> None:
        super().__init__(
            f"message {message_id}: body is not a valid {body_type} for handler "
            f"{handler!r}: {reason}"
        )
        self.handler = handler
        self.message_id = message_id
        self.body_type = body_type
        self.reason = reason


class RegistrationError(ConfigurationError):
    """A handler registration is invalid (duplicate name, unstable default name, bad option)."""


class InvalidKey(InboxError):
    """A handler's ``key=`` callable raised or returned something that is not a usable key.

    Raised by :meth:`inbox.Inbox.process` before any handler runs, so a message whose key
    cannot be derived is rejected whole: nothing of it was committed.
    """

    def __init__(self, handler: str, message_id: uuid.UUID, reason: str) -> None:
        super().__init__(f"key for handler {handler!r} on message {message_id}: {reason}")
        self.handler = handler
        self.message_id = message_id
        self.reason = reason


class UnhandledMessage(InboxError):
    """No registered handler takes this message's type (and the inbox is set to raise)."""

    def __init__(self, message_id: uuid.UUID, message_type: str | None) -> None:
        super().__init__(f"no handler for message {message_id} of type {message_type!r}")
        self.message_id = message_id
        self.message_type = message_type


class UndecodableBody(InvalidMessage):
    """A delivery's body cannot be read: unsupported or corrupt compression, a truncated stream,
    or more than the size limit once decompressed. The edges dead-letter it at once."""


class CopyRefused(InboxError):
    """The broker refused a copy the edge published (a retry or dead-letter copy): returned
    as unroutable, nacked, or refused as too large. The original delivery stays unsettled."""


class TransactionControlError(InboxError):
    """A handler tried to end the transaction the inbox owns (commit, rollback, close)."""


class SessionConfigurationError(ConfigurationError):
    """The session factory gives sessions whose transaction the inbox cannot own."""


class HandlerFailed(InboxError):
    """One or more handlers raised; their transactions were rolled back, the others committed.

    ``failures`` maps each failed handler name to its exception; ``result`` holds the outcomes
    of the handlers that did not fail. The exception is chained from the first failure.
    Redelivering the message runs only the failed handlers again: the others are duplicates.
    ``claim_keys`` maps each of the message's handlers to the 16-byte key it claims under (the
    message id's bytes, an ``idempotency-key``'s or what its ``key=`` returned): a worker
    writes the ones that are not the message id on a dead letter, where ``inbox show`` finds
    them.
    """

    def __init__(
        self,
        message_id: uuid.UUID,
        failures: Mapping[str, Exception],
        result: ProcessResult,
        claim_keys: Mapping[str, bytes] | None = None,
    ) -> None:
        details = "; ".join(
            f"{name}: {type(exc).__name__}: {exc}" for name, exc in failures.items()
        )
        super().__init__(f"message {message_id}: {len(failures)} handler(s) failed: {details}")
        self.message_id = message_id
        self.failures = dict(failures)
        self.result = result
        self.claim_keys = dict(claim_keys or {})


class UnsupportedDialect(ConfigurationError):
    """The database dialect has no claim statement (supported: postgresql, sqlite, mysql)."""


class EffectError(InboxError):
    """``inbox.effect`` cannot be used like this: outside a handler of this inbox, re-entered
    with the step it is already in, or with a ``call`` whose result cannot be stored (not
    JSON, or refused by the database as too large)."""


class UncertainEffect(InboxError):
    """An effect outside the database may have been made, and calling it again is not
    allowed: an ``at-most-once`` effect found started or failed by an earlier attempt, or
    an effect whose result could not be stored. Nothing was called. The worker dead-letters
    the delivery at once (``uncertain-effect``); a person finds out what happened and
    releases the record (see docs/effects.md)."""

    def __init__(
        self,
        effect_key: uuid.UUID,
        handler: str,
        step: str,
        *,
        status: str,
        attempts: int,
        why: str,
    ) -> None:
        super().__init__(
            f"effect {step!r} of handler {handler!r} (key {effect_key}) is uncertain after "
            f"{attempts} attempt(s), status {status!r}: {why}"
        )
        self.effect_key = effect_key
        self.handler = handler
        self.step = step
        self.status = status
        self.attempts = attempts


class HandlerInterrupted(InboxError):
    """A handler raised a :class:`BaseException` that is not an :class:`Exception`
    (``asyncio.CancelledError``, a gevent or eventlet timeout, ...). Its transaction was
    rolled back and it counts as a failed handler; the original is ``__cause__``.
    ``KeyboardInterrupt`` and ``SystemExit`` are not wrapped: they stop the process."""

    def __init__(self, handler: str, interrupt: BaseException) -> None:
        super().__init__(f"handler {handler!r} was interrupted by {type(interrupt).__name__}")
        self.handler = handler
        self.interrupt = interrupt


class ClaimCommittedEarly(TransactionControlError):
    """A handler failed after its transaction had been committed under the inbox (a raw
    ``COMMIT``, the driver's ``commit()``, a statement MySQL commits implicitly before, such
    as DDL or ``SET autocommit=1``). The claim is committed but the handler's later writes
    are not, so a redelivery would be skipped as a duplicate: the message must go to the
    dead-letter queue for someone to reconcile, never be retried."""

    def __init__(self, handler: str, message_id: uuid.UUID) -> None:
        super().__init__(
            f"handler {handler!r} failed on message {message_id} after its transaction was "
            "committed under the inbox (raw COMMIT, driver commit(), or an implicit commit on "
            "MySQL): the claim is committed without the handler's later writes. Never end "
            "the transaction in a handler."
        )
        self.handler = handler
        self.message_id = message_id


class PublishError(InboxError):
    """The broker did not take a published message: unroutable (no queue bound for it) or
    nacked. The message was not delivered; publishing it again is safe."""


SETUP_ERRORS: tuple[type[InboxError], ...] = (SessionConfigurationError, UnsupportedDialect)
"""Errors that say the inbox is set up wrong, not that a message failed: raised as themselves
at once (no handler failure recorded, nothing retried), and they stop a worker."""
