"""The pages of the database's records: the effect ledger (mark an uncertain effect done, or
release it), the outbox (retry refused rows now, drop them) and the claims (look up, release),
by :mod:`inbox.admin._effects`, :mod:`inbox.admin._outbox` and :mod:`inbox.admin._claims`."""

from __future__ import annotations

import json
import uuid
from typing import Final
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from inbox.admin import _claims, _effects, _outbox, _render, _status
from inbox.admin._commands import Tables
from inbox.console._audit import audit
from inbox.console._web import (
    HttpProblem,
    User,
    action,
    form_text,
    form_texts,
    page,
    render_page,
    settings_of,
    tables_of,
)

__all__ = [
    "claims",
    "claims_release",
    "effect",
    "effect_done",
    "effect_release",
    "effects",
    "outbox",
    "outbox_drop",
    "outbox_retry",
]

# --- effects --------------------------------------------------------------------------------

_EFFECT_STATUSES: Final = ("uncertain", "started", "failed", _status.DONE_WITHOUT_RESULT, "done")


@page
async def effects(request: Request, user: User) -> Response:
    """The effect ledger by status."""
    settings = settings_of(request)
    tables = tables_of(request)
    status = request.query_params.get("status") or "uncertain"
    if status not in (*_EFFECT_STATUSES, "all"):
        raise HttpProblem(400, f"unknown status: one of {', '.join(_EFFECT_STATUSES)}, all")

    def read() -> tuple[dict[str, int], list[_effects.EffectRecord]]:
        table = tables.effects
        return (
            _effects.count_by_status(settings.engine, table),
            _effects.list_effects(
                settings.engine, table, None if status == "all" else status, limit=200
            ),
        )

    counts, records = await run_in_threadpool(read)
    return render_page(
        request,
        "effects.html",
        user,
        counts=counts,
        records=records,
        status=status,
        statuses=(*_EFFECT_STATUSES, "all"),
    )


def _effect_key(request: Request) -> uuid.UUID:
    try:
        return _effects.parse_effect_key(request.path_params["key"])
    except ValueError as exc:
        raise HttpProblem(400, str(exc)) from None


@page
async def effect(request: Request, user: User) -> Response:
    """One effect record, its claim's records, and what a person can decide."""
    settings = settings_of(request)
    tables = tables_of(request)
    key = _effect_key(request)

    def read() -> tuple[_effects.EffectRecord, _claims.Found]:
        record = _effects.get_effect(settings.engine, tables.effects, key)
        if record is None:
            raise HttpProblem(404, "no such effect record (released meanwhile?)")
        found = _claims.find(
            settings.engine,
            tables.claims,
            tables.effects,
            [_claims.LookupKey(record.claim_key, "claim key")],
            record.handler,
        )
        return record, found

    record, found = await run_in_threadpool(read)
    return render_page(request, "effect.html", user, record=record, found=found, csrf=user.csrf)


@action
async def effect_done(request: Request, user: User, form: FormData) -> Response:
    """Mark an uncertain effect done with the result the provider gave (after confirming)."""
    settings = settings_of(request)
    tables = tables_of(request, form)
    key = _effect_key(request)
    result = form_text(form, "result")
    if form_text(form, "confirmed") != "yes":
        _check_json(result)
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"mark effect {key} done?",
            preview=(
                "The record becomes done with this result: the next attempt returns it "
                f"and does not call. Result: {result}"
            ),
            action_url=f"/effects/{key}/done",
            fields=[("result", result)],
            button="yes, mark it done",
            back=f"/effects/{key}",
            csrf=user.csrf,
        )
    try:
        await run_in_threadpool(_effects.mark_done, settings.engine, tables.effects, key, result)
    except ValueError as exc:  # not JSON, or not uncertain (NotUncertain)
        code = 409 if isinstance(exc, _effects.NotUncertain) else 400
        raise HttpProblem(code, str(exc)) from None
    audit(user.who, "effect.done", 1, {**_tenant(tables), "effect_key": key})
    return render_page(
        request,
        "done.html",
        user,
        title="effect marked done",
        line=f"effect {key} is done with the given result; replay its dead letter to finish",
        back=f"/effects/{key}",
    )


def _tenant(tables: Tables) -> dict[str, object]:
    """The tenant schema an action worked in, for its audit line (nothing without one)."""
    return {"schema": tables.claims.schema} if tables.claims.schema else {}


def _check_json(result: str) -> None:
    try:
        json.loads(result)
    except ValueError as exc:
        raise HttpProblem(400, f"the result is not JSON: {exc}") from None


@action
async def effect_release(request: Request, user: User, form: FormData) -> Response:
    """Release an uncertain effect: its record deleted, the next attempt calls again."""
    settings = settings_of(request)
    tables = tables_of(request, form)
    key = _effect_key(request)
    if form_text(form, "confirmed") != "yes":
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"release effect {key}?",
            preview=(
                "The record is deleted: the next attempt calls again, as a first attempt with "
                "the same key. Do this only when the provider says the call did not happen."
            ),
            action_url=f"/effects/{key}/release",
            fields=[],
            button="yes, release it",
            back=f"/effects/{key}",
            csrf=user.csrf,
        )
    try:
        await run_in_threadpool(_effects.release_effect, settings.engine, tables.effects, key)
    except _effects.NotUncertain as exc:
        raise HttpProblem(409, str(exc)) from None
    audit(user.who, "effect.release", 1, {**_tenant(tables), "effect_key": key})
    return render_page(
        request,
        "done.html",
        user,
        title="effect released",
        line=f"effect {key} released; replay its dead letter: the next attempt calls again",
        back="/effects",
    )


# --- outbox ---------------------------------------------------------------------------------


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
    audit(user.who, "outbox.retry", count, {**_tenant(tables), "chosen": len(ids)})
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
    audit(user.who, "outbox.drop", count, {**_tenant(tables), "chosen": len(ids)})
    return render_page(
        request,
        "done.html",
        user,
        title="outbox: dropped",
        line=f"dropped {count} of {len(ids)} chosen row(s)",
        back="/outbox",
    )


# --- claims ---------------------------------------------------------------------------------


def _lookup(text: str, business_key: bool) -> tuple[_claims.LookupKey, ...]:
    try:
        return _claims.lookup_keys(text, business_key=business_key)
    except ValueError as exc:
        raise HttpProblem(400, str(exc)) from None


@page
async def claims(request: Request, user: User) -> Response:
    """Look a message up by id or business key: which handlers processed it, and when."""
    settings = settings_of(request)
    tables = tables_of(request)
    text = request.query_params.get("q", "").strip()
    business_key = request.query_params.get("key") == "1"
    found = None
    keys: tuple[_claims.LookupKey, ...] = ()
    if text:
        keys = _lookup(text, business_key)
        found = await run_in_threadpool(
            _claims.find, settings.engine, tables.claims, tables.effects, keys
        )
    return render_page(
        request,
        "claims.html",
        user,
        q=text,
        business_key=business_key,
        keys=keys,
        found=found,
        csrf=user.csrf,
    )


@action
async def claims_release(request: Request, user: User, form: FormData) -> Response:
    """Release one handler's claim (and effect records) of a message, after confirming."""
    settings = settings_of(request)
    tables = tables_of(request, form)
    text, handler = form_text(form, "q"), form_text(form, "handler")
    business_key = form_text(form, "key") == "1"
    if not handler:
        raise HttpProblem(400, "which handler? a release is for one handler")
    keys = _lookup(text, business_key)
    back = f"/claims?{urlencode({'q': text, 'key': '1' if business_key else ''})}"
    if form_text(form, "confirmed") != "yes":
        found = await run_in_threadpool(
            _claims.find,
            settings.engine,
            tables.claims,
            tables.effects,
            keys,
            handler,
        )
        if not found:
            raise HttpProblem(404, "nothing to release: no claim or effect record")
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"release {handler}?",
            preview=(
                f"Deletes {len(found.claims)} claim(s) and {len(found.effects)} effect "
                f"record(s) of {handler}: the next delivery runs it again."
            ),
            details=list(_render.found_lines(found)),
            action_url="/claims/release",
            fields=[("q", text), ("key", "1" if business_key else ""), ("handler", handler)],
            button="yes, release",
            back=back,
            csrf=user.csrf,
        )
    released, released_effects = await run_in_threadpool(
        _claims.release,
        settings.engine,
        tables.claims,
        tables.effects,
        keys,
        handler,
    )
    audit(
        user.who,
        "claims.release",
        released,
        {**_tenant(tables), "handler": handler, "lookup": text, "effects": released_effects},
    )
    return render_page(
        request,
        "done.html",
        user,
        title="released",
        line=(
            f"released: {released} claim(s) and {released_effects} effect record(s) of "
            f"{handler} deleted; the next delivery runs it again"
        ),
        back=back,
    )
