"""The text and JSON that ``inbox`` prints: one line per fact, times in UTC ISO 8601."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from inbox._oneline import bounded
from inbox.operations._claims import Found
from inbox.operations._dead_letters import DeadLetterRecord, summary_fields
from inbox.operations._replay import MoveReport
from inbox.operations._status import DONE_WITHOUT_RESULT, StatusReport

__all__ = [
    "BodyView",
    "as_json",
    "body_view",
    "dead_letter_line",
    "found_lines",
    "message_lines",
    "move_line",
    "property_lines",
    "status_lines",
    "when",
]


def when(value: dt.datetime | None) -> str:
    """A time as printed: UTC, to the second; ``-`` for none."""
    return "-" if value is None else value.astimezone(dt.UTC).isoformat(timespec="seconds")


def as_json(value: object) -> str:
    """``value`` (dataclasses, dicts, lists, times, UUIDs) as one JSON document."""
    return json.dumps(_plain(value), indent=2, sort_keys=False) + "\n"


def _plain(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def status_lines(report: StatusReport) -> Iterator[str]:
    """``inbox status`` as text."""
    total = sum(c.count for c in report.claims)
    size = "" if report.size_bytes is None else f", {report.size_bytes / 2**20:.1f} MiB"
    parts = "" if report.partitions is None else f", {report.partitions} partitions"
    yield f"claims in {report.table}: {total}{size}{parts}"
    for c in report.claims:
        yield f"  {c.handler}: {c.count} claims, oldest {when(c.oldest)}, newest {when(c.newest)}"
    if report.outbox is None:
        yield "outbox: no outbox table"
    else:
        o = report.outbox
        yield (
            f"outbox: {o.pending} pending (oldest {when(o.oldest)}), {o.refused} refused at "
            f"least once (oldest {when(o.oldest_refused)})"
        )
        for error, count in o.errors:
            yield f"  {count} x {bounded(error, 200)}"
    if report.effects is None:
        yield "effects: no effect table"
    else:
        e = report.effects
        counts = ", ".join(f"{n} {status}" for status, n in e.by_status.items()) or "none"
        yield f"effects: {counts}"
        for u in e.unfinished:
            error = f": {bounded(u.error, 200)}" if u.error else ""
            if u.status == DONE_WITHOUT_RESULT:
                yield (
                    f"  done without result: {u.handler} step {u.step!r} after {u.attempts} "
                    f"attempt(s), since {when(u.updated_at)}: called, its result not stored; "
                    "later attempts raise UncertainEffect until released"
                )
                continue
            yield (
                f"  not done: {u.handler} step {u.step!r} {u.status} after {u.attempts} "
                f"attempt(s), since {when(u.updated_at)}{error}"
            )
    for queue, depth in report.dead_letters.items():
        if depth is None:
            yield f"dead letters in {queue}: no such queue (is it the worker's --queue?)"
        else:
            yield f"dead letters in {queue}: {depth}"


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


def dead_letter_line(letter: DeadLetterRecord) -> str:
    """One dead letter on one line."""
    fields = [
        f"{name}={bounded(str(value), 300)}"
        for name, value in summary_fields(letter)
        if value is not None
    ]
    return " ".join(fields)


def move_line(report: MoveReport, command: str) -> str:
    """The summary line of a replay or a purge."""
    done = {"replay": "replayed", "purge": "purged"}[command]
    verb = f"would {command}" if report.dry_run else done
    target = f" to {report.queue}" if command == "replay" else ""
    line = (
        f"{verb} {report.moved} of {report.present} dead letters from "
        f"{report.dead_letter_queue}{target}"
    )
    left = []
    if report.not_matching:
        left.append(f"{report.not_matching} not matching the filters")
    if report.replayed_too_often:
        left.append(f"{len(report.replayed_too_often)} replayed too often already")
    unread = report.present - report.examined
    if unread > 0:
        left.append(f"{unread} not read (--limit, or taken meanwhile)")
    return line + (f"; left: {', '.join(left)}" if left else "")


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


def message_lines(
    all_properties: Mapping[str, Any], raw_body: bytes | str, max_body: int
) -> Iterator[str]:
    """One dead letter in full: its properties, its headers, and its body (text, or base64
    when it is not UTF-8), cut after ``max_body`` bytes."""
    for name, value in property_lines(all_properties):
        yield f"{name}: {value}"
    view = body_view(raw_body, max_body)
    cut = f", first {view.shown} shown" if view.shown < view.size else ""
    yield f"body ({view.size} bytes{cut}, {view.form}):"
    yield view.text
