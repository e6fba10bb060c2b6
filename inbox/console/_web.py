"""What every page and action of the console shares: the templates (autoescaped), who is
asking, the sign-in and CSRF checks, form fields, one-line problems and the security headers
of every response."""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inbox._cli import first_line, mask_urls
from inbox.console._audit import audit
from inbox.console._auth import SESSION_COOKIE, Sessions, claimed_user
from inbox.console._settings import ConsoleSettings
from inbox.operations import _render
from inbox.operations._dead_letter_sources import is_redis
from inbox.operations._tables import Tables

__all__ = [
    "SCHEMA_COOKIE",
    "SECURITY_HEADERS",
    "Action",
    "HttpProblem",
    "Page",
    "SecurityHeaders",
    "User",
    "action",
    "audit_tenant",
    "current_schema",
    "current_user",
    "failure_page",
    "form_text",
    "form_texts",
    "one_line",
    "page",
    "problem_page",
    "render_page",
    "same_origin",
    "sessions_of",
    "settings_of",
    "tables_of",
    "whole_field",
]

SECURITY_HEADERS: Final = {
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


def _when(value: dt.datetime | None) -> Markup:
    """A time as the CLI prints it, in a ``<time>`` that never wraps mid-value."""
    return Markup('<time datetime="{0}">{0}</time>').format(_render.when(value))


def _first_upper(text: str) -> str:
    """``text`` with its first letter upper case (every page's title: "Dead letters")."""
    return text[:1].upper() + text[1:]


_templates.filters["when"] = _when
_templates.filters["first_upper"] = _first_upper


def settings_of(request: Request) -> ConsoleSettings:
    """What this console serves."""
    settings: ConsoleSettings = request.app.state.settings
    return settings


def sessions_of(request: Request) -> Sessions:
    """This console's signed-in browsers."""
    sessions: Sessions = request.app.state.sessions
    return sessions


SCHEMA_COOKIE: Final = "inbox_console_schema"


def current_schema(request: Request, form: FormData | None = None) -> str | None:
    """The tenant schema a request is about (None: the console has no schemas): the form's
    ``schema`` field, else the one chosen on the page (a cookie), else the first. A schema
    that is not one of the console's is a 400."""
    schemas = settings_of(request).schemas
    if not schemas:
        return None
    given = form.get("schema") if form is not None else None
    chosen = given if isinstance(given, str) and given else request.cookies.get(SCHEMA_COOKIE)
    if not chosen:
        return schemas[0]
    if chosen not in schemas:
        raise HttpProblem(400, "not one of this console's schemas (its --schema options)")
    return chosen


def tables_of(request: Request, form: FormData | None = None) -> Tables:
    """The tables a request works on: the console's, in the request's tenant schema."""
    tables = settings_of(request).tables
    schema = current_schema(request, form)
    if schema is None:
        return tables
    return tables.in_schema(schema)


def render_page(
    request: Request, template: str, user: User | None, code: int = 200, **context: Any
) -> HTMLResponse:
    """A template rendered (autoescaped) with what every page shows: who, the mode, the queues."""
    settings = settings_of(request)
    html = _templates.get_template(template).render(
        user=user,
        allow_actions=settings.allow_actions,
        allow_hard_purge=settings.allow_hard_purge,
        # Edit and replay: the handlers to check keys with, on RabbitMQ (_edit_pages).
        can_edit=settings.allow_actions
        and settings.application is not None
        and settings.broker is not None
        and not is_redis(settings.broker),
        queues=settings.queues,
        schemas=settings.schemas,
        schema=_schema_shown(request),
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=code)


def _schema_shown(request: Request) -> str | None:
    try:
        return current_schema(request)
    except HttpProblem:
        return None


def current_user(request: Request) -> User | None:
    """Who the request is from: a session cookie, or an ``Authorization`` header."""
    sessions = sessions_of(request)
    session = sessions.get(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        return User(session.who, session.csrf)
    who = settings_of(request).credentials.from_header(request.headers.get("authorization"))
    return None if who is None else User(who, sessions.header_csrf(who))


def same_origin(request: Request) -> bool:
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
        user = current_user(request)
        if user is None and request.headers.get("authorization"):
            # A script sent credentials that are wrong: it gets 401, not a sign-in page.
            _audit_unproven(request)
            raise HttpProblem(401, "wrong token or password in the Authorization header")
        if user is None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)
        return await handler(request, user)

    return endpoint


def action(handler: Action, *, changes: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """A POST: signed in, same origin, the form's CSRF token right; and, for one that
    ``changes`` something, actions allowed. A refusal is audited too."""

    async def endpoint(request: Request) -> Response:
        user = current_user(request)
        if user is None:
            if request.headers.get("authorization"):
                _audit_unproven(request)
            raise HttpProblem(401, "sign in first: this console needs its token or password")
        if changes and not settings_of(request).allow_actions:
            _audit_refusal(request, user, "read-only")
            raise HttpProblem(
                403, "read-only console: it was started without --allow-actions; nothing changed"
            )
        if not same_origin(request):
            _audit_refusal(request, user, "another origin")
            raise HttpProblem(403, "refused: the form was not sent from this console's page")
        form = await request.form()
        given = form.get("csrf")
        if not isinstance(given, str) or not equal_text(given, user.csrf):
            _audit_refusal(request, user, "csrf")
            raise HttpProblem(403, "refused: the form's CSRF token is missing or wrong")
        return await handler(request, user, form)

    return endpoint


def _audit_refusal(request: Request, user: User, why: str) -> None:
    """An audit line for a refused action: who tried what, and why it was refused."""
    audit(user.who, "refused", 0, {"path": request.url.path, "why": why})


def _audit_unproven(request: Request) -> None:
    """An audit line for a request whose ``Authorization`` header proves no one: the user
    name it claims, when it is HTTP Basic."""
    who = claimed_user(request.headers.get("authorization"))
    audit(who, "refused", 0, {"path": request.url.path, "why": "wrong credentials"})


def equal_text(a: str, b: str) -> bool:
    """Whether two texts are equal, in constant time."""
    return hmac.compare_digest(a.encode("utf-8", "replace"), b.encode("utf-8"))


def form_text(form: FormData, name: str, default: str = "") -> str:
    """A form field, stripped (``default`` when absent or a file)."""
    value = form.get(name, default)
    return value.strip() if isinstance(value, str) else default


def form_texts(form: FormData, name: str) -> list[str]:
    """Every non-empty value of a repeated form field, stripped."""
    return [v.strip() for v in form.getlist(name) if isinstance(v, str) and v.strip()]


def whole_field(text: str, what: str, *, minimum: int = 1) -> int | None:
    """A whole number from a form field (None when empty); a 400 otherwise."""
    if not text:
        return None
    if not text.isdigit() or int(text) < minimum:
        raise HttpProblem(400, f"{what} must be a whole number of at least {minimum}")
    return int(text)


def one_line(exc: BaseException, broker: str | None = None) -> str:
    """An error as one line, URLs masked (never a traceback or a password)."""
    text = mask_urls(first_line(exc))
    return text if broker is None else f"broker: {text}"


async def problem_page(request: Request, exc: Exception) -> Response:
    """An :class:`HttpProblem` as its status and its one line."""
    assert isinstance(exc, HttpProblem)
    return render_page(
        request, "problem.html", current_user(request), exc.status, message=exc.message
    )


async def failure_page(request: Request, exc: Exception) -> Response:
    """Any other error: one line, never a traceback or a secret-bearing URL."""
    return render_page(request, "problem.html", None, 500, message=f"error: {one_line(exc)}")


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


def audit_tenant(tables: Tables) -> dict[str, object]:
    """The tenant schema an action worked in, for its audit line (nothing without one)."""
    return {"schema": tables.claims.schema} if tables.claims.schema else {}
