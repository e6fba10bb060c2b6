"""The audit page: who did what, when, to how many, from the audit file when the console has
one (the records of earlier runs and of the ``inbox`` command too), else from the records
this console process keeps (:func:`inbox.console._audit.recent_audit`), filtered by who,
action, age and a text in the details."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from inbox.console._audit import RECENT_KEPT, AuditRecord, recent_audit
from inbox.console._web import HttpProblem, User, page, render_page, settings_of
from inbox.operations._filters import duration

__all__ = ["AuditFilters", "audit_page"]

_SHOWN: Final = 500  # the records one page lists, at most


@dataclass(frozen=True, slots=True)
class AuditFilters:
    """Which audit records to show: all of those given must hold."""

    who: str = ""
    action: str = ""
    newer_than: dt.timedelta | None = None
    text: str = ""
    """A text the details hold (a queue, a message id...), case-insensitive."""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> AuditFilters:
        """The filters of a page's query string; a 400 for a bad duration."""
        since = query.get("since", "").strip()
        try:
            newer_than = duration(since) if since else None
        except ValueError as exc:
            raise HttpProblem(400, str(exc)) from None
        return cls(
            query.get("who", "").strip(),
            query.get("action", "").strip(),
            newer_than,
            query.get("q", "").strip(),
        )

    def take(self, record: AuditRecord, now: dt.datetime) -> bool:
        """Whether ``record`` passes every filter given."""
        if self.who and record.who != self.who:
            return False
        if self.action and record.action != self.action:
            return False
        if self.newer_than is not None and now - record.at > self.newer_than:
            return False
        if self.text:
            wanted = self.text.casefold()
            return any(wanted in f"{k}={v}".casefold() for k, v in record.details.items())
        return True


def _choices(records: Iterable[AuditRecord]) -> tuple[list[str], list[str]]:
    records = list(records)
    return sorted({r.who for r in records}), sorted({r.action for r in records})


@page
async def audit_page(request: Request, user: User) -> Response:
    """The audit records kept, newest first, filtered."""
    filters = AuditFilters.of(request.query_params)
    audit_file = settings_of(request).audit_file
    try:
        records = await asyncio.to_thread(recent_audit, audit_file)
    except OSError as exc:
        raise HttpProblem(503, f"cannot read the audit file {audit_file}: {exc.strerror}") from None
    now = dt.datetime.now(dt.UTC)
    shown = [r for r in records if filters.take(r, now)]
    people, actions = _choices(records)
    return render_page(
        request,
        "audit.html",
        user,
        records=shown[:_SHOWN],
        matched=len(shown),
        kept=len(records),
        most=RECENT_KEPT,
        shown_at_most=_SHOWN,
        filters=filters,
        audit_file=audit_file,
        since=request.query_params.get("since", ""),
        people=people,
        actions=actions,
    )
