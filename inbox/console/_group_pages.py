"""The failure groups page: a queue's dead letters grouped by how they failed
(:mod:`inbox.operations._failure_groups`), each group with its count, first and last seen and
a sample, and a replay or purge of the whole group through the dead-letter pages' preview and
confirmation (their forms name the group; :mod:`inbox.console._dead_letter_pages` moves it)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from inbox.console._dead_letter_pages import broker_of, queue_of
from inbox.console._web import User, page, render_page, settings_of
from inbox.operations import _dead_letter_sources as sources
from inbox.operations import _dead_letters as _dlq
from inbox.operations import _failure_groups

__all__ = ["failure_groups"]


@page
async def failure_groups(request: Request, user: User) -> Response:
    """A queue's first dead letters (left in place), grouped by their failure fingerprint."""
    queue = queue_of(request, request.query_params.get("queue"))
    broker = broker_of(request)
    limit = settings_of(request).peek_limit
    present, letters = await run_in_threadpool(sources.peek_if_present, broker, queue, limit)
    return render_page(
        request,
        "groups.html",
        user,
        queue=queue,
        dead_letter_queue=_dlq.dead_letter_queue(queue),
        present=present,
        read=len(letters),
        groups=_failure_groups.groups(letters),
        csrf=user.csrf,
    )
