"""The console's web app: Starlette routes rendering Jinja2 templates (autoescaped), every
page behind :mod:`inbox.console._auth`, every change a confirmed, CSRF-checked POST that
calls the same operations as the ``inbox`` command (:mod:`inbox.admin`) and is audited."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import amqp
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inbox._cli import first_line, mask_urls
from inbox.admin import _claims, _effects, _outbox, _render, _replay, _status
from inbox.admin import _dead_letters as _dlq
from inbox.admin._dlq_commands import dead_letter_reason, duration
from inbox.console._audit import audit
from inbox.console._auth import SESSION_COOKIE, Sessions
from inbox.console._settings import ConsoleSettings
from inbox.delivery import headers as h
from inbox.delivery._policy import DeadLetterReason

__all__ = ["create_app"]

_SECURITY_HEADERS: Final = {
    # No inline script or style anywhere: whatever a message body holds cannot run.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on a
    # form POST, and the same-origin check of every action needs the real one.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
_FAILED_LOGIN_PAUSE: Final = 0.5
_REASONS: Final = tuple(r.value for r in DeadLetterReason)
_HISTORY: Final = (
    (h.ORIGINAL_FIRST_FAILURE, "first failed (before any replay)"),
    (h.FIRST_FAILURE, "first failed"),
    (h.LAST_FAILURE, "last failed"),
    (h.DEAD_LETTERED_AT, "dead-lettered"),
    (_dlq.REPLAYED_AT, "replayed last"),
)


@dataclass(frozen=True, slots=True)
class User:
    """Who is asking, and the CSRF token their forms must carry."""

    who: str
    csrf: str


class HttpProblem(Exception):
    """A request the console answers with ``status`` and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_templates = Environment(
    loader=PackageLoader("inbox.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["when"] = _render.when


def _settings(request: Request) -> ConsoleSettings:
    settings: ConsoleSettings = request.app.state.settings
    return settings


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def _render_page(
    request: Request, template: str, user: User | None, code: int = 200, **context: Any
) -> HTMLResponse:
    settings = _settings(request)
    html = _templates.get_template(template).render(
        user=user,
        allow_actions=settings.allow_actions,
        queues=settings.queues,
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=code)


def _user(request: Request) -> User | None:
    """Who the request is from: a session cookie, or an ``Authorization`` header."""
    sessions = _sessions(request)
    session = sessions.get(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        return User(session.who, session.csrf)
    who = _settings(request).credentials.from_header(request.headers.get("authorization"))
    return None if who is None else User(who, sessions.header_csrf(who))


def _same_origin(request: Request) -> bool:
    """A browser's POST names its page's origin; one from another site is refused."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    parts = urlsplit(origin)
    return parts.netloc == request.headers.get("host", "")


Page = Callable[[Request, User], Awaitable[Response]]
Action = Callable[[Request, User, FormData], Awaitable[Response]]


def page(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A page for signed-in users; anyone else is sent to sign in."""

    async def endpoint(request: Request) -> Response:
        user = _user(request)
        if user is None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)
        return await handler(request, user)

    return endpoint


def action(handler: Action, *, changes: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """A POST: signed in, same origin, the form's CSRF token right; and, for one that
    ``changes`` something, actions allowed. A refusal is audited too."""

    async def endpoint(request: Request) -> Response:
        user = _user(request)
        if user is None:
            raise HttpProblem(401, "sign in first: this console needs its token or password")
        if changes and not _settings(request).allow_actions:
            _refused(request, user, "read-only")
            raise HttpProblem(
                403, "read-only console: it was started without --allow-actions; nothing changed"
            )
        if not _same_origin(request):
            _refused(request, user, "another origin")
            raise HttpProblem(403, "refused: the form was not sent from this console's page")
        form = await request.form()
        given = form.get("csrf")
        if not isinstance(given, str) or not _equal_text(given, user.csrf):
            _refused(request, user, "csrf")
            raise HttpProblem(403, "refused: the form's CSRF token is missing or wrong")
        return await handler(request, user, form)

    return endpoint


def _refused(request: Request, user: User, why: str) -> None:
    audit(user.who, "refused", 0, {"path": request.url.path, "why": why})


def _equal_text(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode("utf-8", "replace"), b.encode("utf-8"))


def _text(form: FormData, name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value.strip() if isinstance(value, str) else default


def _texts(form: FormData, name: str) -> list[str]:
    return [v.strip() for v in form.getlist(name) if isinstance(v, str) and v.strip()]


def _whole(text: str, what: str, *, minimum: int = 1) -> int | None:
    if not text:
        return None
    if not text.isdigit() or int(text) < minimum:
        raise HttpProblem(400, f"{what} must be a whole number of at least {minimum}")
    return int(text)


# --- signing in -----------------------------------------------------------------------------


def _safe_next(target: str) -> str:
    """Only a path on this console (never ``//host`` or a URL elsewhere)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


async def login_page(request: Request) -> Response:
    """The sign-in form."""
    return _render_page(
        request, "login.html", None, next=_safe_next(request.query_params.get("next", "/"))
    )


async def login(request: Request) -> Response:
    """Check the token or the user and password; start a session."""
    if not _same_origin(request):
        raise HttpProblem(403, "refused: the form was not sent from this console's page")
    form = await request.form()
    credentials = _settings(request).credentials
    token, user, password = _text(form, "token"), _text(form, "user"), _text(form, "password")
    who = None
    if token and credentials.check_token(token):
        who = "token"
    elif user and password and credentials.check_password(user, password):
        who = user
    target = _safe_next(_text(form, "next", "/"))
    if who is None:
        audit("-", "login", 0, {"outcome": "refused", "client": _client(request)})
        await asyncio.sleep(_FAILED_LOGIN_PAUSE)  # guessing costs time
        return _render_page(
            request, "login.html", None, 401, next=target, error="wrong token or password"
        )
    session_id, _ = _sessions(request).start(who)
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
    _sessions(request).end(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


logout = action(_logout, changes=False)


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
    name = _dlq.dead_letter_queue(queue)
    try:
        with _dlq.open_channel(broker) as channel:
            present, letters = _dlq.peek(channel, queue, limit)
    except amqp.exceptions.NotFound:
        return QueueSummary(queue, name, None, {})
    except Exception as exc:  # one queue's failure is part of the page, not its end
        return QueueSummary(queue, name, None, {}, _one_line(exc, broker))
    reasons = Counter(letter.reason or "unknown" for letter in letters)
    return QueueSummary(queue, name, present, dict(reasons.most_common()))


def _overview(settings: ConsoleSettings) -> dict[str, Any]:
    t = settings.tables
    report = _status.read_status(settings.engine, t.claims, t.outbox, t.effects)
    recent = {
        "the last minute": _status.recent_claims(
            settings.engine, t.claims, dt.timedelta(minutes=1)
        ),
        "the last hour": _status.recent_claims(settings.engine, t.claims, dt.timedelta(hours=1)),
    }
    queues = [
        _queue_summary(settings.broker, q, settings.peek_limit)
        for q in settings.queues
        if settings.broker
    ]
    now = dt.datetime.now(dt.UTC)
    oldest_age = None
    if report.outbox is not None and report.outbox.oldest is not None:
        oldest_age = now - report.outbox.oldest
    return {
        "report": report,
        "recent": recent,
        "dead_letter_queues": queues,
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
    data = await run_in_threadpool(_overview, _settings(request))
    return _render_page(request, "overview.html", user, **data)


@page
async def overview_counts(request: Request, user: User) -> Response:
    """The overview's counts alone, for htmx to refresh them in place."""
    data = await run_in_threadpool(_overview, _settings(request))
    return _render_page(request, "_counts.html", user, **data)


# --- dead letters ---------------------------------------------------------------------------


def _queue(request: Request, name: str | None) -> str:
    settings = _settings(request)
    if not settings.queues:
        raise HttpProblem(404, "no queues: start the console with --queue QUEUE (and a broker)")
    if name is None or name == "":
        return settings.queues[0]
    if name not in settings.queues:
        raise HttpProblem(404, "not one of this console's queues (its --queue options)")
    return name


def _broker(request: Request) -> str:
    broker = _settings(request).broker
    if broker is None:
        raise HttpProblem(404, "no broker: start the console with --broker or INBOX_BROKER_URL")
    return broker


@page
async def dead_letters(request: Request, user: User) -> Response:
    """A queue's dead letters (the first ones, left in place), with their reasons."""
    queue = _queue(request, request.query_params.get("queue"))
    broker = _broker(request)
    limit = _settings(request).peek_limit

    def read() -> tuple[int | None, list[_dlq.DeadLetter]]:
        try:
            with _dlq.open_channel(broker) as channel:
                return _dlq.peek(channel, queue, limit)
        except amqp.exceptions.NotFound:
            return None, []

    present, letters = await run_in_threadpool(read)
    reasons = Counter(letter.reason or "unknown" for letter in letters)
    return _render_page(
        request,
        "dead_letters.html",
        user,
        queue=queue,
        dead_letter_queue=_dlq.dead_letter_queue(queue),
        present=present,
        letters=letters,
        reasons=dict(reasons.most_common()),
        all_reasons=_REASONS,
        csrf=user.csrf,
    )


@page
async def dead_letter(request: Request, user: User) -> Response:
    """One dead letter in full: properties, headers, history, body (escaped, capped)."""
    queue = _queue(request, request.query_params.get("queue"))
    broker = _broker(request)
    message_id = request.query_params.get("id", "")
    max_body = _settings(request).max_body

    def read() -> tuple[_dlq.DeadLetter, list[tuple[str, str]], _render.BodyView, list[Any]]:
        with _dlq.open_channel(broker) as channel:
            message = _dlq.find(channel, queue, message_id)
            if message is None:
                raise HttpProblem(404, "no such dead letter (replayed or purged meanwhile?)")
            headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
            history = sorted(
                (when, label)
                for name, label in _HISTORY
                if (when := h.parse_time(headers.get(name))) is not None
            )
            return (
                _dlq.DeadLetter.read(message),
                list(_render.property_lines(message.properties)),
                _render.body_view(message.body, max_body),
                history,
            )

    letter, properties, body, history = await run_in_threadpool(read)
    return _render_page(
        request,
        "dead_letter.html",
        user,
        queue=queue,
        letter=letter,
        properties=properties,
        body=body,
        history=history,
        csrf=user.csrf,
    )


def _filters(form: FormData) -> tuple[_replay.Filters, dict[str, object]]:
    try:
        reasons = frozenset(dead_letter_reason(r) for r in _texts(form, "reason"))
        older = _text(form, "older_than")
        older_than = duration(older) if older else None
    except Exception as exc:  # argparse's ArgumentTypeError: the CLI's words for bad input
        raise HttpProblem(400, str(exc)) from None
    filters = _replay.Filters(
        reasons,
        frozenset(_texts(form, "handler")),
        older_than,
        frozenset(_texts(form, "id")),
    )
    described: dict[str, object] = {
        "reasons": ",".join(sorted(filters.reasons)) or "any",
        "handlers": ",".join(sorted(filters.handlers)) or "any",
        "older_than": older or "-",
        "ids": ",".join(sorted(filters.message_ids)) or "any",
    }
    return filters, described


async def _move(request: Request, user: User, form: FormData, command: str) -> Response:
    queue = _queue(request, _text(form, "queue"))
    broker = _broker(request)
    filters, described = _filters(form)
    limit = _whole(_text(form, "limit"), "limit")
    max_replays = _whole(_text(form, "max_replays"), "max replays") or 3
    confirmed = _text(form, "confirmed") == "yes"

    def run(dry_run: bool) -> _replay.MoveReport:
        with _dlq.open_channel(broker) as channel:
            if command == "replay":
                return _replay.replay(
                    channel, queue, filters, limit=limit, max_replays=max_replays, dry_run=dry_run
                )
            return _replay.purge(channel, queue, filters, limit=limit, dry_run=dry_run)

    report = await run_in_threadpool(run, not confirmed)
    line = _render.move_line(report, command)
    fields = [("queue", queue), ("limit", _text(form, "limit")), ("max_replays", str(max_replays))]
    fields += [("reason", r) for r in sorted(filters.reasons)]
    fields += [("handler", x) for x in sorted(filters.handlers)]
    fields += [("id", x) for x in sorted(filters.message_ids)]
    fields += [("older_than", _text(form, "older_than"))]
    if not confirmed:
        return _render_page(
            request,
            "confirm.html",
            user,
            title=f"{command} dead letters of {queue}?",
            preview=line,
            left=report.replayed_too_often,
            action_url=f"/dead-letters/{command}",
            fields=fields,
            button=f"yes, {command} them",
            nothing=report.moved == 0,
            back=f"/dead-letters?{urlencode({'queue': queue})}",
            csrf=user.csrf,
        )
    audit(user.who, f"dlq.{command}", report.moved, {"queue": queue, **described})
    return _render_page(
        request,
        "done.html",
        user,
        title=f"{command}: {queue}",
        line=line,
        back=f"/dead-letters?{urlencode({'queue': queue})}",
    )


@action
async def replay(request: Request, user: User, form: FormData) -> Response:
    """Preview a replay (a dry run), and on confirmation replay."""
    return await _move(request, user, form, "replay")


@action
async def purge(request: Request, user: User, form: FormData) -> Response:
    """Preview a purge (a dry run), and on confirmation purge."""
    return await _move(request, user, form, "purge")


# --- effects --------------------------------------------------------------------------------

_EFFECT_STATUSES: Final = ("uncertain", "started", "failed", _status.DONE_WITHOUT_RESULT, "done")


@page
async def effects(request: Request, user: User) -> Response:
    """The effect ledger by status."""
    settings = _settings(request)
    status = request.query_params.get("status") or "uncertain"
    if status not in (*_EFFECT_STATUSES, "all"):
        raise HttpProblem(400, f"unknown status: one of {', '.join(_EFFECT_STATUSES)}, all")

    def read() -> tuple[dict[str, int], list[_effects.EffectRecord]]:
        table = settings.tables.effects
        return (
            _effects.count_by_status(settings.engine, table),
            _effects.list_effects(
                settings.engine, table, None if status == "all" else status, limit=200
            ),
        )

    counts, records = await run_in_threadpool(read)
    return _render_page(
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
    settings = _settings(request)
    key = _effect_key(request)

    def read() -> tuple[_effects.EffectRecord, _claims.Found]:
        record = _effects.get_effect(settings.engine, settings.tables.effects, key)
        if record is None:
            raise HttpProblem(404, "no such effect record (released meanwhile?)")
        found = _claims.find(
            settings.engine,
            settings.tables.claims,
            settings.tables.effects,
            [_claims.LookupKey(record.claim_key, "claim key")],
            record.handler,
        )
        return record, found

    record, found = await run_in_threadpool(read)
    return _render_page(request, "effect.html", user, record=record, found=found, csrf=user.csrf)


@action
async def effect_done(request: Request, user: User, form: FormData) -> Response:
    """Mark an uncertain effect done with the result the provider gave (after confirming)."""
    settings = _settings(request)
    key = _effect_key(request)
    result = _text(form, "result")
    if _text(form, "confirmed") != "yes":
        _check_json(result)
        return _render_page(
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
        await run_in_threadpool(
            _effects.mark_done, settings.engine, settings.tables.effects, key, result
        )
    except ValueError as exc:  # not JSON, or not uncertain (NotUncertain)
        code = 409 if isinstance(exc, _effects.NotUncertain) else 400
        raise HttpProblem(code, str(exc)) from None
    audit(user.who, "effect.done", 1, {"effect_key": key})
    return _render_page(
        request,
        "done.html",
        user,
        title="effect marked done",
        line=f"effect {key} is done with the given result; replay its dead letter to finish",
        back=f"/effects/{key}",
    )


def _check_json(result: str) -> None:
    import json

    try:
        json.loads(result)
    except ValueError as exc:
        raise HttpProblem(400, f"the result is not JSON: {exc}") from None


@action
async def effect_release(request: Request, user: User, form: FormData) -> Response:
    """Release an uncertain effect: its record deleted, the next attempt calls again."""
    settings = _settings(request)
    key = _effect_key(request)
    if _text(form, "confirmed") != "yes":
        return _render_page(
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
        await run_in_threadpool(
            _effects.release_effect, settings.engine, settings.tables.effects, key
        )
    except _effects.NotUncertain as exc:
        raise HttpProblem(409, str(exc)) from None
    audit(user.who, "effect.release", 1, {"effect_key": key})
    return _render_page(
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
    settings = _settings(request)
    table = settings.tables.outbox

    def read() -> tuple[_status.StatusReport, list[_outbox.OutboxRow], list[_outbox.OutboxRow]]:
        t = settings.tables
        report = _status.read_status(settings.engine, t.claims, t.outbox, t.effects)
        if report.outbox is None:
            return report, [], []
        return (
            report,
            _outbox.list_rows(settings.engine, table, refused_only=True, limit=200),
            _outbox.list_rows(settings.engine, table, limit=50),
        )

    report, refused, pending = await run_in_threadpool(read)
    return _render_page(
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
        ids = [_outbox.parse_row_id(x) for x in _texts(form, "id")]
    except ValueError as exc:
        raise HttpProblem(400, str(exc)) from None
    if not ids:
        raise HttpProblem(400, "choose at least one row")
    return ids


@action
async def outbox_retry(request: Request, user: User, form: FormData) -> Response:
    """Make refused rows due now: the relay sends them at its next look."""
    settings = _settings(request)
    ids = _row_ids(form)
    count = await run_in_threadpool(_outbox.retry_now, settings.engine, settings.tables.outbox, ids)
    audit(user.who, "outbox.retry", count, {"chosen": len(ids)})
    return _render_page(
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
    settings = _settings(request)
    ids = _row_ids(form)
    if _text(form, "confirmed") != "yes":
        return _render_page(
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
    count = await run_in_threadpool(_outbox.drop_rows, settings.engine, settings.tables.outbox, ids)
    audit(user.who, "outbox.drop", count, {"chosen": len(ids)})
    return _render_page(
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
    settings = _settings(request)
    text = request.query_params.get("q", "").strip()
    business_key = request.query_params.get("key") == "1"
    found = None
    keys: tuple[_claims.LookupKey, ...] = ()
    if text:
        keys = _lookup(text, business_key)
        found = await run_in_threadpool(
            _claims.find, settings.engine, settings.tables.claims, settings.tables.effects, keys
        )
    return _render_page(
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
    settings = _settings(request)
    text, handler = _text(form, "q"), _text(form, "handler")
    business_key = _text(form, "key") == "1"
    if not handler:
        raise HttpProblem(400, "which handler? a release is for one handler")
    keys = _lookup(text, business_key)
    back = f"/claims?{urlencode({'q': text, 'key': '1' if business_key else ''})}"
    if _text(form, "confirmed") != "yes":
        found = await run_in_threadpool(
            _claims.find,
            settings.engine,
            settings.tables.claims,
            settings.tables.effects,
            keys,
            handler,
        )
        if not found:
            raise HttpProblem(404, "nothing to release: no claim or effect record")
        return _render_page(
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
        settings.tables.claims,
        settings.tables.effects,
        keys,
        handler,
    )
    audit(
        user.who,
        "claims.release",
        released,
        {"handler": handler, "lookup": text, "effects": released_effects},
    )
    return _render_page(
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


# --- the app --------------------------------------------------------------------------------


def _one_line(exc: BaseException, broker: str | None = None) -> str:
    text = mask_urls(first_line(exc))
    return text if broker is None else f"broker: {text}"


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpProblem)
    return _render_page(request, "problem.html", _user(request), exc.status, message=exc.message)


async def _failure(request: Request, exc: Exception) -> Response:
    """Any other error: one line, never a traceback or a secret-bearing URL."""
    return _render_page(request, "problem.html", None, 500, message=f"error: {_one_line(exc)}")


class _SecurityHeaders:
    """Adds :data:`_SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in _SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


def create_app(settings: ConsoleSettings) -> Starlette:
    """The console as an ASGI app (serve it with uvicorn, or test it with Starlette's
    ``TestClient``)."""
    static = StaticFiles(packages=[("inbox.console", "static")])
    app = Starlette(
        routes=[
            Route("/login", login_page, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/", overview, methods=["GET"]),
            Route("/overview/counts", overview_counts, methods=["GET"]),
            Route("/dead-letters", dead_letters, methods=["GET"]),
            Route("/dead-letters/message", dead_letter, methods=["GET"]),
            Route("/dead-letters/replay", replay, methods=["POST"]),
            Route("/dead-letters/purge", purge, methods=["POST"]),
            Route("/effects", effects, methods=["GET"]),
            Route("/effects/{key}", effect, methods=["GET"]),
            Route("/effects/{key}/done", effect_done, methods=["POST"]),
            Route("/effects/{key}/release", effect_release, methods=["POST"]),
            Route("/outbox", outbox, methods=["GET"]),
            Route("/outbox/retry", outbox_retry, methods=["POST"]),
            Route("/outbox/drop", outbox_drop, methods=["POST"]),
            Route("/claims", claims, methods=["GET"]),
            Route("/claims/release", claims_release, methods=["POST"]),
            Mount("/static", static, name="static"),
        ],
        middleware=[Middleware(_SecurityHeaders)],
        exception_handlers={HttpProblem: _problem, Exception: _failure},
    )
    app.state.settings = settings
    app.state.sessions = Sessions()
    return app
