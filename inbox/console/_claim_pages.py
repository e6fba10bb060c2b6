"""The claims' pages: look a message up by id or business key (a message id no claim has also
through its dead letter, in the console's queues), release one handler's claim
(:mod:`inbox.operations._claims`)."""

from __future__ import annotations

import functools
from urllib.parse import urlencode

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
from inbox.operations import _claims, _render

__all__ = ["claims", "claims_release"]


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
    lookup = None
    if text:
        _lookup(text, business_key)  # a 400 for what cannot be a key
        # A message id no claim has: its dead letter, if any, names its handlers' keys.
        lookup = await run_in_threadpool(
            functools.partial(
                _claims.look_up,
                settings.engine,
                tables.claims,
                tables.effects,
                text,
                business_key=business_key,
                broker=settings.broker,
                queues=settings.queues,
            )
        )
    return render_page(
        request,
        "claims.html",
        user,
        q=text,
        business_key=business_key,
        keys=lookup.keys if lookup else (),
        found=lookup.found if lookup else None,
        dead_letter_queue=lookup.dead_letter_queue if lookup else None,
        read_in_part=[
            _render.read_in_part_line(dlq, present, _claims.DEAD_LETTERS_READ)
            for dlq, present in (lookup.read_in_part if lookup else ())
        ],
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
        {**audit_tenant(tables), "handler": handler, "lookup": text, "effects": released_effects},
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
