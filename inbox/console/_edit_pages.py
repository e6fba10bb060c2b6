"""Edit a dead letter and replay the edited copy (:mod:`inbox.operations._edit`): a form
with its JSON body and its application headers, a check (JSON, and with the application's
``Inbox`` its handlers' body types and claim keys), a confirmation showing the before and
the after, and the replay, audited with both."""

from __future__ import annotations

import json
from typing import Any
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
    form_text,
    page,
    render_page,
    settings_of,
    tables_of,
)
from inbox.errors import ConfigurationError
from inbox.operations import _archive, _edit
from inbox.operations import _dead_letters as _dlq
from inbox.operations._dead_letter_sources import is_redis

__all__ = ["edit_form", "edit_replay"]


def _where(request: Request, queue: str | None) -> tuple[str, str]:
    settings = settings_of(request)
    if not settings.allow_actions:
        raise HttpProblem(
            403, "read-only console: it was started without --allow-actions; nothing changed"
        )
    if settings.broker is None or not settings.queues:
        raise HttpProblem(404, "no queues: start the console with --queue QUEUE (and a broker)")
    if queue not in settings.queues:
        raise HttpProblem(404, "not one of this console's queues (its --queue options)")
    if is_redis(settings.broker):
        raise HttpProblem(
            404, "edit and replay is for RabbitMQ's dead letters: on Redis, replay or archive"
        )
    if settings.application is None:
        # Without the handlers an edit of a field a key is computed from would give the
        # message a new key: handlers that committed it would run it again.
        raise HttpProblem(
            403,
            "editing needs the application's handlers, to check that no claim key changes: "
            "start the console with --app MODULE:INBOX",
        )
    return settings.broker, queue


def _read(broker: str, queue: str, message_id: str) -> _edit.Original:
    with _dlq.open_channel(broker) as channel:  # closed: the letter is back in its place
        message = _dlq.find(channel, queue, message_id)
        if message is None:
            raise HttpProblem(404, "no such dead letter (replayed or purged meanwhile?)")
        try:
            return _edit.original(message)
        except ConfigurationError as exc:
            raise HttpProblem(400, f"this dead letter cannot be edited: {exc}") from None


@page
async def edit_form(request: Request, user: User) -> Response:
    """The edit form of one dead letter."""
    broker, queue = _where(request, request.query_params.get("queue"))
    message_id = request.query_params.get("id", "")
    start = await run_in_threadpool(_read, broker, queue, message_id)
    return _form(
        request,
        user,
        queue,
        start,
        body=json.dumps(start.body, ensure_ascii=False, indent=2),
        headers=json.dumps(_edit.editable_headers(start.headers), ensure_ascii=False, indent=2),
        problems=[],
    )


def _form(
    request: Request,
    user: User,
    queue: str,
    start: _edit.Original,
    *,
    body: str,
    headers: str,
    problems: list[str],
) -> Response:
    return render_page(
        request,
        "edit.html",
        user,
        400 if problems else 200,
        queue=queue,
        letter=start.record,
        before=start.before,
        body=body,
        headers=headers,
        problems=problems,
        checked=settings_of(request).application is not None,
        csrf=user.csrf,
    )


@action
async def edit_replay(request: Request, user: User, form: FormData) -> Response:
    """Check an edit (a problem: the form again, with it), confirm it, replay it."""
    broker, queue = _where(request, form_text(form, "queue"))
    message_id = form_text(form, "id")
    before = form_text(form, "before")
    body_text, headers_text = _raw(form, "body"), _raw(form, "headers")
    start = await run_in_threadpool(_read, broker, queue, message_id)
    if start.before != before:
        raise HttpProblem(409, "the dead letter changed since the form was shown: edit it again")
    application = settings_of(request).application
    try:
        edited = _edit.parse_edit(start, body_text, headers_text)
    except ConfigurationError as exc:
        return _form(
            request, user, queue, start, body=body_text, headers=headers_text, problems=[str(exc)]
        )
    problems, checks = _edit.check_handlers(
        application.handlers if application is not None else (), start, edited
    )
    if problems:
        return _form(
            request, user, queue, start, body=body_text, headers=headers_text, problems=problems
        )
    back = f"/dead-letters/message?{urlencode({'queue': queue, 'id': message_id})}"
    shown_before = json.dumps(start.body, ensure_ascii=False)
    shown_headers_before = json.dumps(
        _edit.editable_headers(start.headers), ensure_ascii=False, sort_keys=True
    )
    if form_text(form, "confirmed") != "yes":
        details = [
            f"body before: {shown_before}",
            f"body after: {edited.shown_body}",
            f"headers before: {shown_headers_before}",
            f"headers after: {edited.shown_headers}",
            *(checks or ["no handler checked: start the console with --app to check them"]),
        ]
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"replay the edited {message_id}?",
            preview=(
                f"Replays the edited copy to {queue} under the same message id and keys, "
                "then takes the dead letter: handlers that committed it skip it."
            ),
            details=details,
            action_url="/dead-letters/edit",
            fields=_fields(queue, message_id, before, body_text, headers_text),
            button="yes, replay the edited copy",
            back=back,
            csrf=user.csrf,
        )

    settings, tables = settings_of(request), tables_of(request, form)
    kept: list[str] = []

    def keep(record: Any, headers: Any, properties: Any, body: bytes) -> None:
        archived = _archive.keep_letter(
            settings.engine,
            tables.archive,
            record,
            queue=queue,
            kind="amqp",
            headers=headers,
            properties=properties,
            body=body,
            who=user.who,
        )
        kept.append(str(archived))

    def replay() -> bool:
        with _dlq.open_channel(broker) as channel:
            return _edit.replay_edited(
                channel, queue, message_id, before, edited, who=user.who, keep=keep
            )

    if not await run_in_threadpool(replay):
        raise HttpProblem(409, "the dead letter is gone or changed: nothing was replayed")
    audited: dict[str, Any] = {
        "queue": queue,
        "id": message_id,
        "before": f"{shown_before} {shown_headers_before}",
        "after": f"{edited.shown_body} {edited.shown_headers}",
        "fingerprint_before": before,
        "original_archived_as": kept[0] if kept else "-",
    }
    audit(user.who, "dlq.edit-replay", 1, audited)
    return render_page(
        request,
        "done.html",
        user,
        title=f"replayed the edited {message_id}",
        line=f"replayed the edited copy of {message_id} to {queue}",
        back=f"/dead-letters?{urlencode({'queue': queue})}",
    )


def _raw(form: FormData, name: str) -> str:
    value = form.get(name, "")
    return value if isinstance(value, str) else ""


def _fields(queue: str, message_id: str, before: str, body: str, headers: str) -> list[Any]:
    return [
        ("queue", queue),
        ("id", message_id),
        ("before", before),
        ("body", body),
        ("headers", headers),
    ]
