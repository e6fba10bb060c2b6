"""With OpenTelemetry, a message published through the outbox carries the trace context of
the transaction that published it, so the consumer's spans continue that trace and not the
relay's; a traceparent the caller gives is kept."""

from __future__ import annotations

from opentelemetry import trace
from sqlalchemy import select
from sqlalchemy.orm import Session
from support.databases import Database
from support.telemetry import sdk

from inbox import Outbox
from inbox.outbox import row_from_mapping
from inbox.schema import outbox_message

GIVEN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_publishing_span_is_stored_with_the_row_and_a_given_one_wins(db: Database) -> None:
    sdk()
    outbox = Outbox()
    tracer = trace.get_tracer("test_outbox_trace")
    with tracer.start_as_current_span("POST /orders") as span, Session(db.engine) as session:
        with session.begin():
            traced = outbox.publish(session, "order.created", {}, routing_key="q")
            given = outbox.publish(
                session, "order.created", {}, routing_key="q", headers={"traceparent": GIVEN}
            )
        context = span.get_span_context()
    untraced_session = Session(db.engine)
    with untraced_session.begin():
        untraced = outbox.publish(untraced_session, "order.created", {}, routing_key="q")
    untraced_session.close()

    with db.engine.connect() as connection:
        rows = {
            r.id: r
            for r in (
                row_from_mapping(m._mapping) for m in connection.execute(select(outbox_message))
            )
        }
    traceparent = rows[traced].headers["traceparent"]
    assert traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert rows[given].headers["traceparent"] == GIVEN
    assert "traceparent" not in rows[untraced].headers
