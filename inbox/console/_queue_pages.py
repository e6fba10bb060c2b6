"""The live queues page (:mod:`inbox.operations._queues`): every queue the workers consume
with its depth, unacked messages, consumers and rates, and every worker's counters and when
it last answered; htmx refreshes the numbers in place every few seconds."""

from __future__ import annotations

import datetime as dt
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from inbox.console._settings import ConsoleSettings
from inbox.console._web import User, page, render_page, settings_of
from inbox.operations import _queues

__all__ = ["queues_live", "queues_page"]


def _watch(request: Request) -> _queues.Watch:
    state = request.app.state
    watch = getattr(state, "queue_watch", None)
    if watch is None:
        watch = state.queue_watch = _queues.Watch()
    assert isinstance(watch, _queues.Watch)
    return watch


def _read(settings: ConsoleSettings, watch: _queues.Watch) -> dict[str, Any]:
    workers = _queues.read_workers(settings.workers, watch)
    queues = (
        _queues.read_queues(settings.broker, settings.queues, workers, watch, settings.management)
        if settings.broker
        else []
    )
    return {
        "live_queues": queues,
        "worker_stats": workers,
        "management": settings.management is not None,
        "seen_at": lambda at: "never" if at is None else dt.datetime.fromtimestamp(at, dt.UTC),
    }


@page
async def queues_page(request: Request, user: User) -> Response:
    """The queues and the workers, refreshed in place."""
    data = await run_in_threadpool(_read, settings_of(request), _watch(request))
    return render_page(request, "queues.html", user, **data)


@page
async def queues_live(request: Request, user: User) -> Response:
    """The queues page's numbers alone, for htmx to refresh them."""
    data = await run_in_threadpool(_read, settings_of(request), _watch(request))
    return render_page(request, "_queues_live.html", user, **data)
