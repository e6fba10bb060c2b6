"""The console's web app: Starlette routes rendering Jinja2 templates (autoescaped), every
page behind :mod:`inbox.console._auth`, every change a confirmed, CSRF-checked POST that
calls the same operations as the ``inbox`` command (:mod:`inbox.operations`) and is audited.
This module signs in and out, shows the overview, and puts the routes together."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from inbox.console import (
    _archive_pages,
    _audit_pages,
    _claim_pages,
    _edit_pages,
    _effect_pages,
    _group_pages,
    _outbox_pages,
    _queue_pages,
    _story_pages,
)
from inbox.console import _dead_letter_pages as letters
from inbox.console._audit import audit
from inbox.console._auth import SESSION_COOKIE, Sessions
from inbox.console._settings import ConsoleSettings
from inbox.console._web import (
    SCHEMA_COOKIE,
    HttpProblem,
    SecurityHeaders,
    User,
    action,
    current_schema,
    failure_page,
    form_text,
    one_line,
    page,
    problem_page,
    render_page,
    same_origin,
    sessions_of,
    settings_of,
    tables_of,
)
from inbox.operations import _dead_letter_sources as sources
from inbox.operations import _dead_letters as _dlq
from inbox.operations import _status
from inbox.operations._tables import Tables
from inbox.operations._workers import read_readiness

__all__ = ["create_app"]

_FAILED_LOGIN_PAUSE: Final = 0.5


# --- signing in -----------------------------------------------------------------------------


def _safe_next(target: str) -> str:
    """Only a path on this console (never ``//host`` or a URL elsewhere)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


async def login_page(request: Request) -> Response:
    """The sign-in form."""
    return render_page(
        request, "login.html", None, next=_safe_next(request.query_params.get("next", "/"))
    )


async def login(request: Request) -> Response:
    """Check the token or the user and password; start a session."""
    if not same_origin(request):
        raise HttpProblem(403, "refused: the form was not sent from this console's page")
    form = await request.form()
    credentials = settings_of(request).credentials
    token, user, password = (
        form_text(form, "token"),
        form_text(form, "user"),
        form_text(form, "password"),
    )
    who = None
    if token and credentials.check_token(token):
        who = "token"
    elif user and password and credentials.check_password(user, password):
        who = user
    target = _safe_next(form_text(form, "next", "/"))
    if who is None:
        audit(user or "-", "login", 0, {"outcome": "refused", "client": _client(request)})
        await asyncio.sleep(_FAILED_LOGIN_PAUSE)  # guessing costs time
        return render_page(
            request, "login.html", None, 401, next=target, error="wrong token or password"
        )
    session_id, _ = sessions_of(request).start(who)
    audit(who, "login", 1, {"outcome": "signed in", "client": _client(request)})
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


def _client(request: Request) -> str:
    return request.client.host if request.client else "-"


async def _logout(request: Request, user: User, form: FormData) -> Response:
    """End the session (also on a read-only console: it changes nothing of the inbox's)."""
    sessions_of(request).end(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


logout = action(_logout, changes=False)


async def _choose_schema(request: Request, user: User, form: FormData) -> Response:
    """Work on another tenant schema (a cookie; the page shows which)."""
    schema = current_schema(request, form)
    if schema is None:
        raise HttpProblem(404, "this console has no schemas (start it with --schema)")
    back = _safe_next(form_text(form, "back", "/"))
    response = RedirectResponse(back, status_code=303)
    response.set_cookie(
        SCHEMA_COOKIE,
        schema,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


choose_schema = action(_choose_schema, changes=False)

# --- overview -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """A dead-letter queue's depth (None: no such queue) and its first letters' reasons."""

    queue: str
    dead_letter_queue: str
    depth: int | None
    reasons: dict[str, int]
    error: str | None = None


def _queue_summary(broker: str, queue: str, limit: int) -> QueueSummary:
    """The depth, and the reasons of the first ``limit`` dead letters (0: depth alone, read
    without holding any message: what the overview's refresh every few seconds reads)."""
    name = _dlq.dead_letter_queue(queue)
    try:
        present, letters = sources.peek_if_present(broker, queue, limit)
    except Exception as exc:  # one queue's failure is part of the page, not its end
        return QueueSummary(queue, name, None, {}, one_line(exc, broker))
    reasons = Counter(letter.reason or "unknown" for letter in letters)
    return QueueSummary(queue, name, present, dict(reasons.most_common()))


def _overview(settings: ConsoleSettings, t: Tables, reasons: bool) -> dict[str, Any]:
    report = _status.read_status(settings.engine, t.claims, t.outbox, t.effects)
    recent = {
        "1 min": _status.recent_claims(settings.engine, t.claims, dt.timedelta(minutes=1)),
        "1 h": _status.recent_claims(settings.engine, t.claims, dt.timedelta(hours=1)),
    }
    queues = [
        _queue_summary(settings.broker, q, settings.peek_limit if reasons else 0)
        for q in settings.queues
        if settings.broker
    ]
    workers = read_readiness(settings.workers)
    now = dt.datetime.now(dt.UTC)
    oldest_age = None
    if report.outbox is not None and report.outbox.oldest is not None:
        oldest_age = now - report.outbox.oldest
    return {
        "report": report,
        "recent": recent,
        "dead_letter_queues": queues,
        "workers": workers,
        "outbox_age": oldest_age,
        "uncertain": sum(
            n
            for status, n in (report.effects.by_status if report.effects else {}).items()
            if status != _status.DONE
        ),
    }


@page
async def overview(request: Request, user: User) -> Response:
    """Claims, dead letters, uncertain effects and the outbox backlog at a glance."""
    data = await run_in_threadpool(_overview, settings_of(request), tables_of(request), True)
    return render_page(request, "overview.html", user, **data)


@page
async def overview_counts(request: Request, user: User) -> Response:
    """The overview's counts alone, for htmx to refresh them in place (dead letters as
    depths only: a refresh holds no message, so it never counts as a quorum queue's
    delivery)."""
    data = await run_in_threadpool(_overview, settings_of(request), tables_of(request), False)
    return render_page(request, "_counts.html", user, **data)


def create_app(settings: ConsoleSettings) -> Starlette:
    """The console as an ASGI app (serve it with uvicorn, or test it with Starlette's
    ``TestClient``)."""
    static = StaticFiles(packages=[("inbox.console", "static")])
    app = Starlette(
        routes=[
            Route("/login", login_page, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/schema", choose_schema, methods=["POST"]),
            Route("/", overview, methods=["GET"]),
            Route("/overview/counts", overview_counts, methods=["GET"]),
            Route("/dead-letters", letters.dead_letters, methods=["GET"]),
            Route("/dead-letters/message", letters.dead_letter, methods=["GET"]),
            Route("/dead-letters/groups", _group_pages.failure_groups, methods=["GET"]),
            Route("/dead-letters/replay", letters.replay, methods=["POST"]),
            Route("/dead-letters/purge", letters.purge, methods=["POST"]),
            Route("/dead-letters/edit", _edit_pages.edit_form, methods=["GET"]),
            Route("/dead-letters/edit", _edit_pages.edit_replay, methods=["POST"]),
            Route("/effects", _effect_pages.effects, methods=["GET"]),
            Route("/effects/{key}", _effect_pages.effect, methods=["GET"]),
            Route("/effects/{key}/done", _effect_pages.effect_done, methods=["POST"]),
            Route("/effects/{key}/release", _effect_pages.effect_release, methods=["POST"]),
            Route("/outbox", _outbox_pages.outbox, methods=["GET"]),
            Route("/outbox/retry", _outbox_pages.outbox_retry, methods=["POST"]),
            Route("/outbox/drop", _outbox_pages.outbox_drop, methods=["POST"]),
            Route("/claims", _claim_pages.claims, methods=["GET"]),
            Route("/claims/release", _claim_pages.claims_release, methods=["POST"]),
            Route("/audit", _audit_pages.audit_page, methods=["GET"]),
            Route("/dead-letters/archive", letters.archive, methods=["POST"]),
            Route("/archive", _archive_pages.archived, methods=["GET"]),
            Route("/archive/restore", _archive_pages.archive_restore, methods=["POST"]),
            Route("/archive/delete", _archive_pages.archive_delete, methods=["POST"]),
            Route("/story", _story_pages.story, methods=["GET"]),
            Route("/queues", _queue_pages.queues_page, methods=["GET"]),
            Route("/queues/live", _queue_pages.queues_live, methods=["GET"]),
            Mount("/static", static, name="static"),
        ],
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={HttpProblem: problem_page, Exception: failure_page},
    )
    app.state.settings = settings
    app.state.sessions = Sessions()
    return app
