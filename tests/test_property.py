"""Property: for any stream of deliveries — redeliveries, re-sends under the same business
key, handler failures, fan-out — every (operation, handler) effect commits exactly once."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import sessionmaker
from support.databases import effects, effects_metadata
from support.effects import Recorder, order

from inbox import HandlerFailed, Inbox, Message
from inbox.message import IDEMPOTENCY_KEY_HEADER
from inbox.schema import metadata

HANDLERS = ("billing.charge", "shipping.reserve", "audit.log")

delivery = st.tuples(
    st.integers(min_value=0, max_value=7),  # which business operation
    st.booleans(),  # re-sent by the producer with a fresh id (same idempotency key)
    st.sampled_from((None, *HANDLERS)),  # a handler that fails on this delivery
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stream=st.lists(delivery, min_size=1, max_size=40))
def test_any_delivery_stream_commits_each_effect_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, stream: list[tuple[int, bool, str | None]]
) -> None:
    path = tmp_path_factory.mktemp("prop") / "inbox.db"
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    effects_metadata.create_all(engine)
    recorder = Recorder(Inbox(sessionmaker(engine)))
    for name in HANDLERS:
        recorder.add(name, "order.created")
    sent: dict[int, Message] = {}
    reported_failures: list[tuple[set[str], str | None]] = []
    try:
        for operation, resend, failing in stream:
            if operation not in sent or resend:
                sent[operation] = order(
                    operation, **{IDEMPOTENCY_KEY_HEADER: f"operation-{operation}"}
                )
            if failing is not None:
                recorder.fail[failing] = 1
            try:
                recorder.inbox.process(sent[operation])
            except HandlerFailed as failed:
                reported_failures.append((set(failed.failures), failing))
            recorder.fail.clear()
        for message in sent.values():  # the broker redelivers until everything is acked
            recorder.inbox.process(message)
        with engine.connect() as connection:
            rows = connection.execute(
                select(effects.c.ref, effects.c.handler, func.count()).group_by(
                    effects.c.ref, effects.c.handler
                )
            ).all()
    finally:
        engine.dispose()
    assert all(names == {failing} for names, failing in reported_failures)
    assert {(ref, handler): n for ref, handler, n in rows} == {
        (str(op), name): 1 for op in sent for name in HANDLERS
    }
