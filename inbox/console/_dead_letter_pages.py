"""The dead-letter pages: a queue's dead letters, one in full, and replay or purge (one, or
a filtered set) through a dry-run preview and a confirmation, by :mod:`inbox.operations._replay`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from inbox.console import _letter_table as table
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
    whole_field,
)
from inbox.delivery import headers as h
from inbox.operations import _archive, _render, _replay
from inbox.operations import _dead_letter_sources as sources
from inbox.operations import _dead_letters as _dlq
from inbox.operations._filters import (
    REASONS,
    Filters,
    dead_letter_reason,
    duration,
    failure_group,
)

__all__ = [
    "archive",
    "broker_of",
    "dead_letter",
    "dead_letters",
    "purge",
    "queue_of",
    "replay",
]

_HISTORY: Final = (
    (h.ORIGINAL_FIRST_FAILURE, "first failed (before any replay)"),
    (h.FIRST_FAILURE, "first failed"),
    (h.LAST_FAILURE, "last failed"),
    (h.DEAD_LETTERED_AT, "dead-lettered"),
    (_dlq.REPLAYED_AT, "replayed last"),
)


_PREVIEWED: Final = 100  # the dead letters a confirmation page lists


def queue_of(request: Request, name: str | None) -> str:
    """The queue a request names: one of the console's (the first when none is named)."""
    settings = settings_of(request)
    if not settings.queues:
        raise HttpProblem(404, "no queues: start the console with --queue QUEUE (and a broker)")
    if name is None or name == "":
        return settings.queues[0]
    if name not in settings.queues:
        raise HttpProblem(404, "not one of this console's queues (its --queue options)")
    return name


def broker_of(request: Request) -> str:
    """The console's broker URL; a 404 when it has none."""
    broker = settings_of(request).broker
    if broker is None:
        raise HttpProblem(404, "no broker: start the console with --broker or INBOX_BROKER_URL")
    return broker


@page
async def dead_letters(request: Request, user: User) -> Response:
    """A queue's dead letters (the first ones, left in place), with their reasons."""
    queue = queue_of(request, request.query_params.get("queue"))
    broker = broker_of(request)
    limit = settings_of(request).peek_limit

    order = table.order_of(request.query_params.get("sort"), request.query_params.get("order"))

    present, letters = await run_in_threadpool(sources.peek_if_present, broker, queue, limit)
    reasons = Counter(letter.reason or "unknown" for letter in letters)
    return render_page(
        request,
        "dead_letters.html",
        user,
        queue=queue,
        dead_letter_queue=_dlq.dead_letter_queue(queue),
        present=present,
        letters=table.sorted_letters(letters, order),
        columns=table.COLUMNS,
        order=order,
        error_line=table.error_line,
        reasons=dict(reasons.most_common()),
        all_reasons=REASONS,
        csrf=user.csrf,
    )


@page
async def dead_letter(request: Request, user: User) -> Response:
    """One dead letter in full: properties, headers, history, body (escaped, capped)."""
    queue = queue_of(request, request.query_params.get("queue"))
    broker = broker_of(request)
    message_id = request.query_params.get("id", "")
    max_body = settings_of(request).max_body

    def read() -> tuple[_dlq.DeadLetterRecord, list[tuple[str, str]], _render.BodyView, list[Any]]:
        with sources.open_dead_letters(broker) as source:
            found = source.find(queue, message_id)
        if found is None:
            raise HttpProblem(404, "no such dead letter (replayed or purged meanwhile?)")
        message_properties, message_body = found
        headers: Mapping[str, Any] = message_properties.get("application_headers") or {}
        history = sorted(
            (when, label)
            for name, label in _HISTORY
            if (when := h.parse_time(headers.get(name))) is not None
        )
        return (
            _dlq.DeadLetterRecord.of(message_properties, headers, message_body),
            list(_render.property_lines(message_properties)),
            _render.body_view(message_body, max_body),
            history,
        )

    letter, properties, body, history = await run_in_threadpool(read)
    return render_page(
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


def _filters(form: FormData) -> tuple[Filters, dict[str, object]]:
    try:
        reasons = frozenset(dead_letter_reason(r) for r in form_texts(form, "reason"))
        groups = frozenset(failure_group(g) for g in form_texts(form, "group"))
        older = form_text(form, "older_than")
        older_than = duration(older) if older else None
    except ValueError as exc:  # the CLI's words for bad input
        raise HttpProblem(400, str(exc)) from None
    filters = Filters(
        reasons,
        frozenset(form_texts(form, "handler")),
        older_than,
        frozenset(form_texts(form, "id")),
        groups,
    )
    described: dict[str, object] = {
        "reasons": ",".join(sorted(filters.reasons)) or "any",
        "handlers": ",".join(sorted(filters.handlers)) or "any",
        "older_than": older or "-",
        "ids": ",".join(sorted(filters.message_ids)) or "any",
        **({"groups": ",".join(sorted(filters.groups))} if filters.groups else {}),
    }
    return filters, described


async def _move(request: Request, user: User, form: FormData, command: str) -> Response:
    queue = queue_of(request, form_text(form, "queue"))
    broker = broker_of(request)
    filters, described = _filters(form)
    if form_text(form, "selection") == "yes" and not filters.message_ids:
        raise HttpProblem(400, "no dead letter selected: tick the rows to replay or purge")
    limit = whole_field(form_text(form, "limit"), "limit")
    max_replays = whole_field(form_text(form, "max_replays"), "max replays") or 3
    confirmed = form_text(form, "confirmed") == "yes"
    keep_tries = form_text(form, "keep_tries") == "yes"
    preview = _preview_bound(form) if confirmed else None

    def run(dry_run: bool) -> _replay.MoveReport:
        with sources.open_dead_letters(broker) as source:
            if command == "archive":
                return _archive.archive(
                    source,
                    settings_of(request).engine,
                    tables_of(request, form).archive,
                    queue,
                    filters=filters,
                    who=user.who,
                    limit=limit,
                    dry_run=dry_run,
                    preview=preview,
                )
            if command == "replay":
                return _replay.replay(
                    source,
                    queue,
                    filters,
                    limit=limit,
                    max_replays=max_replays,
                    keep_tries=keep_tries,
                    dry_run=dry_run,
                    preview=preview,
                )
            return _replay.purge(
                source, queue, filters, limit=limit, dry_run=dry_run, preview=preview
            )

    report = await run_in_threadpool(run, not confirmed)
    line = _render.move_line(report, command)
    fields = [
        ("queue", queue),
        ("limit", form_text(form, "limit")),
        ("max_replays", str(max_replays)),
        ("keep_tries", "yes" if keep_tries else ""),
    ]
    fields += [("reason", r) for r in sorted(filters.reasons)]
    fields += [("handler", x) for x in sorted(filters.handlers)]
    fields += [("id", x) for x in sorted(filters.message_ids)]
    fields += [("group", x) for x in sorted(filters.groups)]
    fields += [("older_than", form_text(form, "older_than"))]
    # The confirmed run reads and takes no more than this preview did (see _preview_bound).
    fields += [("preview_read", str(report.examined)), ("preview_taken", str(report.moved))]
    if not confirmed:
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"{command} dead letters of {queue}?",
            preview=line,
            taken=report.taken[:_PREVIEWED],
            more=report.moved - min(len(report.taken), _PREVIEWED),
            error_line=table.error_line,
            left=report.replayed_too_often,
            action_url=f"/dead-letters/{command}",
            fields=fields,
            button=f"yes, {command} them",
            nothing=report.moved == 0,
            back=f"/dead-letters?{urlencode({'queue': queue})}",
            csrf=user.csrf,
        )
    details: dict[str, object] = {"queue": queue, **described}
    if command == "replay":
        details |= {"max_replays": max_replays, "keep_tries": keep_tries}
    audit(user.who, f"dlq.{command}", report.moved, details)
    return render_page(
        request,
        "done.html",
        user,
        title=f"{command}: {queue}",
        line=line,
        back=f"/dead-letters?{urlencode({'queue': queue})}",
    )


def _preview_bound(form: FormData) -> _replay.PreviewBound:
    """What the confirmed preview read and would take: the confirmed run goes no further,
    so a dead letter that arrived while the operator read the preview is left in place."""
    read = whole_field(form_text(form, "preview_read"), "preview read", minimum=0)
    taken = whole_field(form_text(form, "preview_taken"), "preview taken", minimum=0)
    if read is None or taken is None:
        raise HttpProblem(400, "no preview to confirm: replay or purge from the preview page")
    return _replay.PreviewBound(read, taken)


@action
async def replay(request: Request, user: User, form: FormData) -> Response:
    """Preview a replay (a dry run), and on confirmation replay."""
    return await _move(request, user, form, "replay")


@action
async def archive(request: Request, user: User, form: FormData) -> Response:
    """Preview an archive (a dry run), and on confirmation move them to the archive table."""
    return await _move(request, user, form, "archive")


@action
async def purge(request: Request, user: User, form: FormData) -> Response:
    """Preview a purge (a dry run), and on confirmation purge: only on a console started
    with ``--allow-hard-purge`` (else dead letters are archived, not deleted)."""
    if not settings_of(request).allow_hard_purge:
        audit(user.who, "refused", 0, {"path": request.url.path, "why": "no hard purge"})
        raise HttpProblem(
            403, "purge deletes for good: archive instead, or start with --allow-hard-purge"
        )
    return await _move(request, user, form, "purge")
