"""Edit a dead letter, then replay the edited copy: a person fixes a JSON body or the
application's headers and puts the message back on its queue under the same message id and
the same claim keys, so every handler that committed it skips it and only those that failed
run. The copy carries :data:`~inbox.delivery.headers.EDITED_AT`, ``EDITED_BY`` and
``EDITED_BEFORE`` (the fingerprint of the letter before the edit).

What an edit may not change: the message id, its type, the ``idempotency-key`` header, the
trace context (``traceparent``, ``tracestate``, ``baggage``) and the ``x-inbox-*`` headers
(the worker's and the replay's own). Given the application's
handlers, an edit is also checked against each handler of the message's type: its ``body=``
type must accept the new body, and its claim key must not change (a ``key=`` reading an
edited field would claim anew and run again, even where it committed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

from inbox.delivery import headers as h
from inbox.errors import ConfigurationError, InboxError
from inbox.message import IDEMPOTENCY_KEY_HEADER, Message
from inbox.operations._dead_letters import (
    DROPPED_PROPERTIES,
    DeadLetterRecord,
    find,
    fingerprint,
    publish_confirmed,
)
from inbox.operations._replay import replayed_headers

__all__ = [
    "Application",
    "EditedLetter",
    "Handler",
    "KeepOriginal",
    "Original",
    "check_handlers",
    "editable_headers",
    "original",
    "parse_edit",
    "replay_edited",
]

_PROTECTED_PREFIX: Final = "x-inbox-"
_KEPT: Final = frozenset({IDEMPOTENCY_KEY_HEADER, "traceparent", "tracestate", "baggage"})
"""Kept as they are: the claim key's header, and the trace context (W3C) the copy goes on."""
_MAX_INT: Final = 2**63


class Handler(Protocol):
    """What an edit is checked against: a registered handler (``inbox.handlers``)."""

    @property
    def name(self) -> str: ...
    @property
    def message_type(self) -> str | None: ...
    @property
    def parse_body(self) -> Any: ...
    def claim_key(self, message: Message) -> bytes: ...


class Application(Protocol):
    """The application's ``Inbox`` or ``AsyncInbox``: its registered handlers."""

    @property
    def handlers(self) -> tuple[Handler, ...]: ...


@dataclass(frozen=True, slots=True)
class Original:
    """A dead letter as an edit starts from it: the decoded JSON body, the headers, and
    the fingerprint that the confirmed edit checks it still has."""

    record: DeadLetterRecord
    body: object
    headers: dict[str, Any]
    before: str


@dataclass(frozen=True, slots=True)
class EditedLetter:
    """The edit as it will go out: the body (JSON bytes) and the full headers."""

    body: bytes
    headers: dict[str, Any]
    shown_body: str
    shown_headers: str


def original(message: Any) -> Original:
    """The dead letter ``message`` as an edit starts from it; ConfigurationError when it
    cannot be edited (not JSON, compressed, no message id)."""
    properties = message.properties
    headers = dict(properties.get("application_headers") or {})
    record = DeadLetterRecord.read(message)
    if not record.message_id:
        raise ConfigurationError("it has no message id: replay it as it is, or purge it")
    encoding = str(properties.get("content_encoding") or "utf-8").lower().replace("-", "")
    if encoding != "utf8" or headers.get("compression"):
        raise ConfigurationError("its body is compressed or encoded: only JSON bodies are edited")
    content_type = str(properties.get("content_type") or "application/json")
    if content_type.split(";", maxsplit=1)[0].strip() != "application/json":
        raise ConfigurationError(f"its body is {content_type}: only JSON bodies are edited")
    try:
        body = json.loads(bytes(message.body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigurationError("its body is not JSON: only JSON bodies are edited") from None
    return Original(record, body, headers, fingerprint(message.body, headers))


def editable_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers an edit may change: not ``x-inbox-*``, ``idempotency-key`` or the trace
    context, and only values JSON can show (the others are kept as they are)."""
    return {
        name: value
        for name, value in headers.items()
        if not _protected(name) and _json_value(value)
    }


def parse_edit(start: Original, body_text: str, headers_text: str) -> EditedLetter:
    """The edited copy of ``start``: ``body_text`` a JSON document, ``headers_text`` a JSON
    object of the editable headers (those left out are removed). ConfigurationError for
    anything else, or for a change of a protected header."""
    try:
        body = json.loads(body_text)
    except ValueError as exc:
        raise ConfigurationError(f"the body is not JSON: {exc}") from None
    try:
        given = json.loads(headers_text) if headers_text.strip() else {}
    except ValueError as exc:
        raise ConfigurationError(f"the headers are not JSON: {exc}") from None
    if not isinstance(given, dict):
        raise ConfigurationError("the headers must be a JSON object of names and values")
    for name, value in given.items():
        if _protected(name):
            raise ConfigurationError(f"header {name!r} is not edited: the message keeps it")
        if not _fits_amqp(value):
            raise ConfigurationError(f"header {name!r}: an integer beyond 64 bits")
    kept = {k: v for k, v in start.headers.items() if _protected(k) or not _json_value(v)}
    headers = {**kept, **given}
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    shown_headers = json.dumps(given, ensure_ascii=False, sort_keys=True)
    return EditedLetter(data, headers, json.dumps(body, ensure_ascii=False), shown_headers)


def check_handlers(
    handlers: Iterable[Handler], start: Original, edited: EditedLetter
) -> tuple[list[str], list[str]]:
    """``(problems, checks)``: what refuses the edit, and what was checked and passed, for
    each handler of the message's type."""
    record = start.record
    try:
        before = Message(record.message_id, record.type, start.body, start.headers)
        after = Message(record.message_id, record.type, json.loads(edited.body), edited.headers)
    except InboxError as exc:  # no handler takes it as it is: the worker said why
        return [f"not a message the inbox takes: {exc}"], []
    problems: list[str] = []
    checks: list[str] = []
    for handler in handlers:
        if handler.message_type is not None and handler.message_type != record.type:
            continue
        try:
            typed_after = _typed(handler, after)
        except Exception as exc:
            problems.append(f"{handler.name}: the new body does not fit its body type: {exc}")
            continue
        try:
            same = handler.claim_key(_typed(handler, before)) == handler.claim_key(typed_after)
        except Exception as exc:  # the old body no longer parses, or its key= raised
            problems.append(f"{handler.name}: its claim key cannot be compared: {exc}")
            continue
        if not same:
            problems.append(
                f"{handler.name}: claims under another key after this edit (its key= reads "
                "what changed): it would run again even where it committed"
            )
            continue
        typed = " fits its body type," if handler.parse_body is not None else ""
        checks.append(f"{handler.name}:{typed} claims under the same key")
    return problems, checks


KeepOriginal: TypeAlias = Callable[
    [DeadLetterRecord, dict[str, Any], dict[str, Any], bytes], object
]
"""Given a dead letter before its edited copy replaces it: its record, headers,
properties and body."""


def replay_edited(
    channel: Any,  # an amqp.Channel (operations import no amqp: test_broker_units)
    queue: str,
    message_id: str,
    before: str,
    edited: EditedLetter,
    *,
    who: str,
    keep: KeepOriginal | None = None,
) -> bool:
    """Put the edited copy of the dead letter ``message_id`` back on ``queue`` (confirmed),
    then take the letter from the dead-letter queue; False when the letter is not there or
    is no longer the one edited (its fingerprint is not ``before``): nothing is sent.
    ``keep`` is given the original first (its record, headers, properties and body), so
    what the edit replaced is kept (the console archives it); if it raises, nothing is
    sent and the letter stays."""
    message = find(channel, queue, message_id)
    if message is None:
        return False
    headers = dict(message.properties.get("application_headers") or {})
    if fingerprint(message.body, headers) != before:
        return False
    record = DeadLetterRecord.read(message)
    if keep is not None:
        keep(record, headers, dict(message.properties), bytes(message.body))
    copied = {k: v for k, v in message.properties.items() if k not in DROPPED_PROPERTIES}
    replayed = replayed_headers(edited.headers, record, keep_tries=False)
    replayed[h.EDITED_AT] = h.now_utc()
    replayed[h.EDITED_BY] = who[:100]
    replayed[h.EDITED_BEFORE] = before
    copied["application_headers"] = replayed
    copied["content_type"] = "application/json"
    copied["content_encoding"] = "utf-8"
    copied["delivery_mode"] = 2
    publish_confirmed(channel, edited.body, copied, queue)
    # Acked only after the broker confirmed the copy, as every replay.
    channel.basic_ack(message.delivery_tag)
    return True


def _typed(handler: Handler, message: Message) -> Message:
    if handler.parse_body is None:
        return message
    return Message(message.id, message.type, handler.parse_body(message.body), message.headers)


def _protected(name: str) -> bool:
    return name.startswith(_PROTECTED_PREFIX) or name in _KEPT


def _json_value(value: object) -> bool:
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if isinstance(value, list | tuple):
        return all(_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_value(v) for k, v in value.items())
    return False


def _fits_amqp(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | list | dict):
        return True
    if isinstance(value, int):
        return -_MAX_INT <= value < _MAX_INT
    items = value.values() if isinstance(value, dict) else value
    return all(_fits_amqp(v) for v in items)
