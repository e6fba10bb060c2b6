"""The archive pages: the dead letters archived instead of deleted (the newest first), and
restoring (replaying to their queue) or deleting chosen ones, each after a confirmation that
lists them, by :mod:`inbox.operations._archive`."""

from __future__ import annotations

import uuid

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from inbox.console._audit import audit
from inbox.console._dead_letter_pages import broker_of
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
from inbox.operations import _archive
from inbox.operations import _dead_letter_sources as sources

__all__ = ["archive_delete", "archive_restore", "archived"]

_CHOSEN_AT_MOST = 1000


@page
async def archived(request: Request, user: User) -> Response:
    """The newest archived dead letters, with their queue, reason, and when and by whom."""
    settings, tables = settings_of(request), tables_of(request)
    rows = await run_in_threadpool(
        _archive.listed, settings.engine, tables.archive, None, _archive.LISTED
    )
    total = await run_in_threadpool(_archive.count_archived, settings.engine, tables.archive)
    return render_page(request, "archive.html", user, rows=rows, total=total, csrf=user.csrf)


def _chosen(form: FormData) -> list[uuid.UUID]:
    texts = form_texts(form, "id")
    if not texts:
        raise HttpProblem(400, "no archived letter selected: tick the rows first")
    if len(texts) > _CHOSEN_AT_MOST:
        raise HttpProblem(400, f"at most {_CHOSEN_AT_MOST} archived letters at once")
    try:
        return [uuid.UUID(text) for text in texts]
    except ValueError:
        raise HttpProblem(400, "an archived letter's id is a UUID") from None


async def _change(request: Request, user: User, form: FormData, command: str) -> Response:
    settings, tables = settings_of(request), tables_of(request, form)
    ids = _chosen(form)
    confirmed = form_text(form, "confirmed") == "yes"
    if not confirmed:
        known = {
            row.id: row
            for row in await run_in_threadpool(
                _archive.listed, settings.engine, tables.archive, None, 100_000
            )
        }
        rows = [known[i] for i in ids if i in known]
        return render_page(
            request,
            "confirm.html",
            user,
            title=f"{command} {len(rows)} archived dead letters?",
            preview=f"would {command} {len(rows)} of the {len(ids)} chosen archived dead letters",
            details=[
                f"{r.ref} from {r.queue}: {r.reason or 'unknown'}, archived by {r.archived_by}"
                for r in rows
            ],
            action_url=f"/archive/{command}",
            fields=[("id", str(r.id)) for r in rows],
            button=f"yes, {command} them",
            nothing=not rows,
            back="/archive",
            csrf=user.csrf,
        )
    details: dict[str, object] = {**audit_tenant(tables), "ids": ",".join(map(str, ids))}
    try:
        if command == "restore":
            broker = broker_of(request)

            def restore() -> int:
                with sources.open_dead_letters(broker) as source:
                    return len(_archive.restore(source, settings.engine, tables.archive, ids))

            count = await run_in_threadpool(restore)
            line = f"restored {count} of {len(ids)} archived dead letters to their queues"
        else:
            count = await run_in_threadpool(
                _archive.delete_archived, settings.engine, tables.archive, ids
            )
            line = f"deleted {count} of {len(ids)} archived dead letters for good"
    except Exception as error:
        # Some may have been restored or deleted before the error: the attempt is audited
        # too, with what went wrong, so no change leaves the audit without a line.
        failed = {**details, "outcome": "failed", "error": f"{type(error).__name__}: {error}"}
        audit(user.who, f"archive.{command}", 0, failed)
        raise
    audit(user.who, f"archive.{command}", count, {**details, "outcome": "done"})
    return render_page(
        request, "done.html", user, title=f"archive: {command}", line=line, back="/archive"
    )


@action
async def archive_restore(request: Request, user: User, form: FormData) -> Response:
    """Confirm, then put the chosen archived dead letters back on their queues."""
    return await _change(request, user, form, "restore")


@action
async def archive_delete(request: Request, user: User, form: FormData) -> Response:
    """Confirm, then delete the chosen archived dead letters for good: only on a console
    started with ``--allow-hard-purge``, as a purge (archive then delete is a purge)."""
    if not settings_of(request).allow_hard_purge:
        audit(user.who, "refused", 0, {"path": request.url.path, "why": "no hard purge"})
        raise HttpProblem(
            403,
            "deleting archived dead letters is for good: keep them (inbox-cleanup "
            "--archive-days expires them), or start with --allow-hard-purge",
        )
    return await _change(request, user, form, "delete")
