"""Records rendered as text for a person, the same in the ``inbox`` command and the console:
times in UTC ISO 8601, a claim lookup and a replay's summary as lines, a message's properties
and its body as shown."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

from inbox._oneline import bounded
from inbox.operations._claims import Found
from inbox.operations._replay import MoveReport

__all__ = [
    "BodyView",
    "body_view",
    "found_lines",
    "message_id_hint",
    "move_line",
    "property_lines",
    "when",
]


def when(value: dt.datetime | None) -> str:
    """A time as printed: UTC, to the second; ``-`` for none."""
    return "-" if value is None else value.astimezone(dt.UTC).isoformat(timespec="seconds")


def found_lines(found: Found) -> Iterator[str]:
    """``inbox show`` as text: each claim, then each effect record."""
    for claim in found.claims:
        yield (
            f"{claim.handler}: processed at {when(claim.processed_at)} "
            f"(claim key {claim.key.key}, the {claim.key.how})"
        )
    for effect in found.effects:
        error = f", error {bounded(effect.error, 200)}" if effect.error else ""
        yield (
            f"  effect {effect.handler} step {effect.step!r}: {effect.status}, "
            f"{effect.attempts} attempt(s), started {when(effect.started_at)}, updated "
            f"{when(effect.updated_at)}{error}"
        )


def read_in_part_line(dead_letter_queue: str, present: int, read: int) -> str:
    """That a lookup read only the first ``read`` of a dead-letter queue's letters."""
    return (
        f"read only the first {read:,} of the {present:,} dead letters in {dead_letter_queue}: "
        f"its dead letter may be further back (inbox dlq show ID reads them all)"
    )


def message_id_hint(looked_in_dead_letters: bool) -> Iterator[str]:
    """Why a message id finds no claim, and where the keys are (``inbox show``)."""
    yield (
        "a handler claims under the message id only without key= and without an "
        "idempotency-key header; otherwise under that key, and the claims table holds no "
        "message id beside it"
    )
    yield (
        "the key is in the worker's log lines for the message ('under claim key K'; at "
        "--log-level DEBUG for a handler that committed), in its dead letter's "
        "x-inbox-claim-keys and idempotency-key headers (inbox dlq show ID), or what your "
        "key= function returns for the message: inbox show KEY"
    )
    if not looked_in_dead_letters:
        yield "to look in the dead letters: inbox show ID --queue QUEUE"


def move_line(report: MoveReport, command: str) -> str:
    """The summary line of a replay or a purge: moved of present, then read and matched,
    then what was left and why."""
    done = {"replay": "replayed", "purge": "purged", "archive": "archived"}[command]
    verb = f"would {command}" if report.dry_run else done
    target = {"replay": f" to {report.queue}", "archive": " to the archive"}.get(command, "")
    line = (
        f"{verb} {report.moved} of {report.present} dead letters from "
        f"{report.dead_letter_queue}{target} (read {report.examined}, matched {report.matched})"
    )
    left = []
    if report.not_matching:
        left.append(f"{report.not_matching} not matching the filters")
    if report.replayed_too_often:
        left.append(f"{len(report.replayed_too_often)} replayed too often already")
    unread = report.present - report.examined
    if unread > 0:
        if report.after_preview:
            why = "not read by the preview"
        elif report.limit_reached:
            why = f"--limit {report.limit} reached"
        elif report.to_read < report.present:
            why = f"--max-read {report.to_read}"
        else:
            why = "taken meanwhile"
        left.append(f"{unread} not read ({why})")
    line += f"; left: {', '.join(left)}" if left else ""
    if report.after_preview:
        line += (
            f" (bounded to the preview: the first {report.to_read} dead letters, at most "
            f"{report.limit} taken; any dead-lettered since are left in place)"
        )
    return line


@dataclasses.dataclass(frozen=True, slots=True)
class BodyView:
    """A message body as shown to a person: ``text`` is the first ``shown`` of ``size``
    bytes, decoded as UTF-8 (``form`` ``"text"``) or, when they are not UTF-8, in base64
    (``form`` ``"base64"``)."""

    text: str
    form: str
    size: int
    shown: int


def body_view(raw_body: bytes | str, max_body: int) -> BodyView:
    """The first ``max_body`` bytes of a body, as text when they are UTF-8, else base64."""
    body = raw_body if isinstance(raw_body, bytes) else raw_body.encode()
    shown = body[:max_body]
    try:
        return BodyView(shown.decode("utf-8"), "text", len(body), len(shown))
    except UnicodeDecodeError:
        return BodyView(base64.b64encode(shown).decode("ascii"), "base64", len(body), len(shown))


def property_lines(all_properties: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """A message's properties, then its headers (``header NAME``), each value cut after
    1000 characters, sorted by name within each."""
    properties = {k: v for k, v in all_properties.items() if k != "application_headers"}
    for name, value in sorted(properties.items()):
        yield name, bounded(str(value), 1000)
    headers = all_properties.get("application_headers") or {}
    for name, value in sorted(headers.items()):
        yield f"header {name}", bounded(str(value), 1000)
