"""The effect ledger's pages: effects by status, one effect's detail and timeline, and the
actions "mark done with this result" and "release for another call"
(:mod:`inbox.operations._effects`)."""

from __future__ import annotations

import json
import uuid
from typing import Final

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
    page,
    render_page,
    settings_of,
    tables_of,
)
from inbox.operations import _claims, _effects, _status

__all__ = ["effect", "effect_done", "effect_release", "effects"]

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
    audit(user.who, "effect.done", 1, {**audit_tenant(tables), "effect_key": key})
    return render_page(
        request,
        "done.html",
        user,
        title="effect marked done",
        line=f"effect {key} is done with the given result; replay its dead letter to finish",
        back=f"/effects/{key}",
    )


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
    audit(user.who, "effect.release", 1, {**audit_tenant(tables), "effect_key": key})
    return render_page(
        request,
        "done.html",
        user,
        title="effect released",
        line=f"effect {key} released; replay its dead letter: the next attempt calls again",
        back="/effects",
    )
