"""What ``inbox`` prints: the status report, dead letters one per line and one in full, and
any record as JSON; one line per fact, times in UTC ISO 8601."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from inbox._oneline import bounded
from inbox.operations._dead_letters import DeadLetterRecord, summary_fields
from inbox.operations._failure_groups import FailureGroup
from inbox.operations._render import body_view, property_lines, when
from inbox.operations._status import DONE_WITHOUT_RESULT, StatusReport

__all__ = [
    "as_json",
    "dead_letter_line",
    "group_document",
    "group_lines",
    "message_lines",
    "status_lines",
]


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


def dead_letter_line(letter: DeadLetterRecord) -> str:
    """One dead letter on one line."""
    fields = [
        f"{name}={bounded(str(value), 300)}"
        for name, value in summary_fields(letter)
        if value is not None
    ]
    return " ".join(fields)


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


def group_lines(group: FailureGroup) -> Iterator[str]:
    """One failure group of ``inbox dlq groups``: its id and count, then how it failed, when
    and a sample."""
    print_ = group.fingerprint
    yield (
        f"{group.id} count={group.count} first={when(group.first_seen)} "
        f"last={when(group.last_seen)}"
    )
    yield (
        f"  reason={print_.reason} handlers={','.join(print_.handlers) or '-'} "
        f"exception={print_.exception_type or '-'}"
    )
    yield f"  error={bounded(print_.message, 200) or '-'}"
    if print_.frame is not None:
        yield f"  frame={bounded(print_.frame, 200)}"
    yield f"  sample: {dead_letter_line(group.sample)}"


def group_document(group: FailureGroup) -> dict[str, object]:
    """One failure group as ``inbox dlq groups --json`` writes it."""
    print_ = group.fingerprint
    return {
        "id": group.id,
        "count": group.count,
        "first_seen": group.first_seen,
        "last_seen": group.last_seen,
        "reason": print_.reason,
        "handlers": list(print_.handlers),
        "exception_type": print_.exception_type,
        "error": print_.message,
        "frame": print_.frame,
        "refs": group.refs,
        "sample": group.sample,
    }
