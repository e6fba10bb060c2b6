"""One message's story on a page (:mod:`inbox.operations._story`): by message id or business
key, its claims, its effect records (each linked to its page), the messages it sent and the
one that caused it (each linked to its own story), and its dead letters and those of the
messages it sent (each linked to the letter)."""

from __future__ import annotations

import functools

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from inbox.console._web import HttpProblem, User, page, render_page, settings_of, tables_of
from inbox.operations import _claims, _render, _story

__all__ = ["story"]


@page
async def story(request: Request, user: User) -> Response:
    """The story of the message ``?q=`` names (``&key=1``: a business key)."""
    settings = settings_of(request)
    text = request.query_params.get("q", "").strip()
    business_key = request.query_params.get("key") == "1"
    told = None
    if text:
        try:
            _claims.lookup_keys(text, business_key=business_key)
        except ValueError as exc:
            raise HttpProblem(400, str(exc)) from None
        told = await run_in_threadpool(
            functools.partial(
                _story.tell,
                settings.engine,
                tables_of(request),
                text,
                business_key=business_key,
                broker=settings.broker,
                queues=settings.queues,
            )
        )
    read_in_part = []
    if told is not None:
        parts = list(told.lookup.read_in_part) + told.read_in_part
        read_in_part = [
            _render.read_in_part_line(dlq, present, _claims.DEAD_LETTERS_READ)
            for dlq, present in dict(parts).items()
        ]
    return render_page(
        request,
        "story.html",
        user,
        q=text,
        business_key=business_key,
        story=told,
        read_in_part=read_in_part,
    )
