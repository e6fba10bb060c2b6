"""The audit file both front ends share: one JSON object a line (``time`` in UTC, ``who``,
``action``, ``count`` and the details), appended by ``inbox console --audit-file`` and by
the ``inbox`` command's changes (``dlq replay|purge|archive``, ``release``) when given the
same file (``--audit-file`` or :data:`AUDIT_FILE_ENV`), and read back, newest first, by the
console's audit page: so the page survives a restart and shows what the command did."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from inbox._oneline import bounded

__all__ = [
    "AUDIT_FILE_ENV",
    "READ_BYTES",
    "AuditRecord",
    "append_record",
    "audit_line",
    "plain",
    "read_newest",
]

AUDIT_FILE_ENV: Final = "INBOX_AUDIT_FILE"
"""The audit file when ``--audit-file`` is not given (``inbox console`` and ``inbox``)."""
READ_BYTES: Final = 4 * 1024 * 1024
"""The end of the audit file the console's page reads, at most: the newest records only."""
_SUMMARY: Final = ("time", "who", "action", "count")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit line as the audit page shows it: when (UTC), who, what, how many, and the
    details (bounded texts)."""

    at: dt.datetime
    who: str
    action: str
    count: int
    details: dict[str, object]


def plain(details: Mapping[str, object]) -> dict[str, object]:
    """``details`` as an audit line holds them: bools and ints as they are, the rest as texts
    of at most 200 characters."""
    return {k: v if isinstance(v, bool | int) else bounded(str(v), 200) for k, v in details.items()}


def audit_line(at: dt.datetime, facts: Mapping[str, object]) -> str:
    """One audit line: ``time`` (``at``, ISO 8601) and the ``facts`` (who, action, count and
    the details), as one JSON object without a line break."""
    return json.dumps({"time": at.isoformat(timespec="milliseconds"), **facts}, ensure_ascii=False)


def append_record(
    path: str, who: str, action: str, count: int, details: Mapping[str, object]
) -> None:
    """Append one audit line to the file at ``path`` (created if missing), in one write."""
    facts = {"who": bounded(who, 100), "action": action, "count": count, **plain(details)}
    line = audit_line(dt.datetime.now(dt.UTC), facts) + "\n"
    with open(path, "a", encoding="utf-8") as file:
        file.write(line)


def read_newest(path: str, limit: int, max_bytes: int = READ_BYTES) -> list[AuditRecord]:
    """The newest ``limit`` audit records of the file at ``path``, newest first, from its
    last ``max_bytes`` at most; lines that are not audit records (another program's, one cut
    by a crash) are left out. A missing file has none; one that cannot be read is an
    ``OSError``."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            file.seek(start)
            data = file.read(size - start)
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line read is the tail of one cut by the window
    found: list[AuditRecord] = []
    for raw in reversed(lines):
        record = _parsed(raw)
        if record is not None:
            found.append(record)
            if len(found) >= limit:
                break
    return found


def _parsed(raw: bytes) -> AuditRecord | None:
    try:
        facts = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(facts, dict):
        return None
    try:
        at = dt.datetime.fromisoformat(str(facts.get("time")))
    except ValueError:
        return None
    who, action, count = facts.get("who"), facts.get("action"), facts.get("count")
    if not isinstance(who, str) or not isinstance(action, str):
        return None
    return AuditRecord(
        at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC),
        who,
        action,
        count if isinstance(count, int) and not isinstance(count, bool) else 0,
        {k: v for k, v in facts.items() if k not in _SUMMARY},
    )
