"""The chord recheck (inbox.celery._chords) on Celery's real Redis result backend, without a
worker: a forked process reports a chord's last part and dies in the callback's publish,
holding the dispatch claim; the recheck waits out its lease and sends the callback once.

Also the canary of the Celery internals the recheck reads (docs/architecture.md, "Private
internals of dependencies"): the claim is the group's ``.c`` key, with a lease (a TTL),
``done`` once the callback was published; the chord's size is its ``.s`` key."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals, states
from celery.app.task import Context
from support.redis import REDIS_URL, redis_area

from inbox.celery._chords import RECHECK_TASK, RECHECKS, claim_state, register


@pytest.fixture
def app() -> Iterator[Celery]:
    with redis_area(REDIS_URL.rsplit("/", 1)[0] + "/5") as area:
        app = Celery("chords", broker="memory://", backend=area.url)
        # A short lease: the claim's 5 s, extended to about 6 s before the publish.
        app.conf.update(result_chord_join_timeout=1, broker_connection_timeout=1)
        register(app)
        try:
            yield app
        finally:
            app.close()


def test_a_dispatch_claim_left_by_a_dead_process_is_retaken_by_the_recheck(app: Celery) -> None:
    @app.task(name="chords.body", shared=False)
    def body(values: list[str]) -> None: ...

    backend = app.backend
    group, part = uuid.uuid4().hex, uuid.uuid4().hex
    callback = body.s().set(task_id=uuid.uuid4().hex)
    backend.set_chord_size(group, 1)
    context = Context(id=part, group=group, group_index=0, chord=dict(callback))
    assert claim_state(backend, group) == "open"

    child = os.fork()
    if child == 0:  # reports the last part, takes the claim, dies in the publish
        try:
            signals.before_task_publish.connect(
                lambda **_: os.kill(os.getpid(), signal.SIGKILL), weak=False
            )
            backend.on_chord_part_return(context, states.SUCCESS, "value")
        finally:
            os._exit(3)  # not reached: the publish kills it
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status), "the child died in the publish"
    claim = backend.get_key_for_group(group, ".c")
    assert claim_state(backend, group) == "held"
    lease = int(backend.client.ttl(claim))
    assert 0 < lease <= 10

    published: list[Any] = []

    def count(sender: str | None = None, body: Any = None, **_: Any) -> None:
        published.append((sender, body))

    signals.before_task_publish.connect(count, weak=False)
    try:
        recheck = app.tasks[RECHECK_TASK]
        arguments = (group, part, 0, dict(callback), "value", RECHECKS, "celery")
        # Celery's own second report does not dispatch while the dead claim's lease runs.
        backend.on_chord_part_return(context, states.SUCCESS, "value")
        assert [s for s, _ in published] == []
        assert recheck(*arguments) == "held"  # sends itself again, past the lease
        [(sender, again)] = published
        assert sender == RECHECK_TASK
        assert again[0][5] == RECHECKS - 1
        published.clear()
        time.sleep(lease + 1)
        assert recheck(*arguments) == "done"
        assert [s for s, _ in published] == ["chords.body"], "the callback, once"
        assert published[0][1][0] == (["value"],)
        assert backend.get(claim) == b"done"
        published.clear()
        assert recheck(*arguments) == "done"  # a later recheck sends nothing
        assert published == []
    finally:
        signals.before_task_publish.disconnect(count)


def test_a_recheck_of_a_chord_that_is_gone_does_nothing(app: Celery) -> None:
    group = uuid.uuid4().hex
    assert claim_state(app.backend, group) == "gone"
    recheck = app.tasks[RECHECK_TASK]
    assert recheck(group, uuid.uuid4().hex, 0, {}, None, RECHECKS, "celery") == "gone"
