"""The outbox's pages: pending and refused rows with their last error; retry now, drop
(:mod:`inbox.operations._outbox`)."""

from __future__ import annotations

import uuid

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from inbox.console._audit import audit
from inbox.console._web import (
    HttpProblem,
    User,
    action,
    audit_tenant,
    form_text,
    form_texts,
    page,
    render_page,
    settings_of,
    tables_of,
)
from inbox.operations import _outbox, _status

__all__ = ["outbox", "outbox_drop", "outbox_retry"]


@page
async def outbox(request: Request, user: User) -> Response:
    """Pending and refused outbox rows."""
    settings = settings_of(request)
    tables = tables_of(request)
    table = tables.outbox

    def read() -> tuple[_status.StatusReport, list[_outbox.OutboxRow], list[_outbox.OutboxRow]]:
        t = tables
        report = _status.read_status(settings.engine, t.claims, t.outbox, t.effects)
        if report.outbox is None:
            return report, [], []
        return (
            report,
            _outbox.list_rows(settings.engine, table, refused_only=True, limit=200),
            _outbox.list_rows(settings.engine, table, limit=50),
        )

    report, refused, pending = await run_in_threadpool(read)
    return render_page(
        request,
        "outbox.html",
        user,
        report=report.outbox,
        refused=refused,
        pending=pending,
        csrf=user.csrf,
    )


def _row_ids(form: FormData) -> list[uuid.UUID]:
    try:
        ids = [_outbox.parse_row_id(x) for x in form_texts(form, "id")]
    except ValueError as exc:
        raise HttpProblem(400, str(exc)) from None
    if not ids:
        raise HttpProblem(400, "choose at least one row")
    return ids


@action
async def outbox_retry(request: Request, user: User, form: FormData) -> Response:
    """Make refused rows due now: the relay sends them at its next look."""
    settings = settings_of(request)
    tables = tables_of(request, form)
    ids = _row_ids(form)
    count = await run_in_threadpool(_outbox.retry_now, settings.engine, tables.outbox, ids)
    audit(user.who, "outbox.retry", count, {**audit_tenant(tables), "chosen": len(ids)})
    return render_page(
        request,
        "done.html",
        user,
        title="outbox: retry now",
        line=f"{count} of {len(ids)} chosen row(s) due now: the relay sends them at its next look",
        back="/outbox",
    )


@action
async def outbox_drop(request: Request, user: User, form: FormData) -> Response:
    """Drop refused rows for good, after confirming."""
    settings = settings_of(request)
    tables = tables_of(request, form)
    ids = _row_ids(form)
    if form_text(form, "confirmed") != "yes":
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"drop {len(ids)} outbox row(s)?",
            preview="These messages will never be sent. Only rows the broker refused are dropped.",
            action_url="/outbox/drop",
            fields=[("id", str(i)) for i in ids],
            button="yes, drop them",
            back="/outbox",
            csrf=user.csrf,
        )
    count = await run_in_threadpool(_outbox.drop_rows, settings.engine, tables.outbox, ids)
    audit(user.who, "outbox.drop", count, {**audit_tenant(tables), "chosen": len(ids)})
    return render_page(
        request,
        "done.html",
        user,
        title="outbox: dropped",
        line=f"dropped {count} of {len(ids)} chosen row(s)",
        back="/outbox",
    )
