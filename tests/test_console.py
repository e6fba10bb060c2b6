"""The console's handlers through Starlette's TestClient, on real PostgreSQL and RabbitMQ:
signing in, read-only mode, CSRF, and each job (dead letters, effects, outbox, claims) done
through the same operations as the ``inbox`` command, with previews, confirmations and an
audit line; hostile message bodies rendered as text."""

from __future__ import annotations

import base64
import datetime as dt
import io
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from console_support import (
    PASSWORD,
    SMS_HANDLER,
    TOKEN,
    Sms,
    confirmation,
    csrf_of,
    dead_letter,
    declare_queues,
    refused_outbox_row,
    settings,
    tables,
)
from sqlalchemy import Engine, MetaData, func, insert, select, text
from sqlalchemy.orm import sessionmaker
from starlette.testclient import TestClient
from support.databases import Database
from support.rabbit import Rabbit

from inbox import HandlerFailed, Inbox, Message, UncertainEffect
from inbox.admin import admin_main
from inbox.admin._parser import command_parsers
from inbox.broker import Relay
from inbox.console import ConsoleSettings, create_app, load_credentials
from inbox.console._auth import SESSION_COOKIE
from inbox.delivery import headers as h
from inbox.operations._dead_letters import REPLAYS, dead_letter_queue, open_channel
from inbox.operations._workers import check_worker_url
from inbox.schema import effect_table, inbox_table, outbox_table


def client_for(console: ConsoleSettings) -> TestClient:
    return TestClient(create_app(console), base_url="http://127.0.0.1:8765")


def signed_in(console: ConsoleSettings) -> TestClient:
    client = client_for(console)
    response = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303, response.text
    assert SESSION_COOKIE in response.cookies
    return client


AuditLines = Callable[[], list[str]]


@pytest.fixture
def audit_lines(caplog: pytest.LogCaptureFixture) -> Iterator[AuditLines]:
    """The audit lines written so far in the test."""
    with caplog.at_level(logging.INFO, logger="inbox.console.audit"):
        yield lambda: [r.getMessage() for r in caplog.records if r.name == "inbox.console.audit"]


def dlq_ids(rabbit: Rabbit, queue: str) -> list[str]:
    """The message ids in ``queue``, read without taking them."""
    ids = []
    with open_channel(rabbit.url) as channel:
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            ids.append(message.properties.get("message_id"))
    return ids


# --- who may use it ------------------------------------------------------------------------


def test_nothing_is_shown_or_done_without_the_token_or_password(pg_db: Database) -> None:
    client = client_for(settings(pg_db, None))
    for path in ("/", "/effects", "/outbox", "/claims?q=x", "/dead-letters"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"].startswith("/login?next=")
    refused = client.post("/outbox/drop", data={"id": str(uuid.uuid4()), "csrf": "x"})
    assert refused.status_code == 401

    wrong = client.post("/login", data={"token": TOKEN + "x"}, follow_redirects=False)
    assert wrong.status_code == 401
    assert "wrong token or password" in wrong.text
    assert SESSION_COOKIE not in wrong.cookies
    bad_basic = "Basic " + base64.b64encode(b"alice:nope").decode()
    for bad in (bad_basic, f"Bearer {TOKEN}x", "Bearer", "Digest x"):
        # a script with wrong credentials gets 401, never the HTML sign-in page
        answer = client.get("/dead-letters", headers={"authorization": bad}, follow_redirects=False)
        assert answer.status_code == 401, bad
        assert "wrong token or password in the Authorization header" in answer.text

    basic = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert client.get("/", headers={"authorization": basic}).status_code == 200
    bearer = client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200
    assert "Claims" in bearer.text


def test_sign_in_with_user_and_password_then_out(pg_db: Database) -> None:
    client = client_for(settings(pg_db, None))
    response = client.post(
        "/login",
        data={"user": "alice", "password": PASSWORD, "next": "//evil.example/x"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/"  # never a redirect off the console
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    page = client.get("/")
    assert 'id="who">alice<' in page.text
    client.post("/logout", data={"csrf": csrf_of(page.text)})
    assert client.get("/", follow_redirects=False).status_code == 303


def test_every_page_forbids_scripts_and_framing(pg_db: Database) -> None:
    client = signed_in(settings(pg_db, None))
    for path in ("/", "/effects", "/outbox", "/claims", "/login"):
        response = client.get(path)
        assert response.status_code == 200, path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert response.headers["x-frame-options"] == "DENY"
    htmx = client.get("/static/htmx.min.js")
    assert htmx.status_code == 200
    assert "htmx" in htmx.text[:200]


def test_a_read_only_console_refuses_every_action(
    pg_db: Database, rabbit: Rabbit, audit_lines: AuditLines
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    sms = Sms(pg_db)
    key = sms.fail_once()
    row = refused_outbox_row(pg_db, rabbit, rabbit.queue("missing"))
    client = signed_in(settings(pg_db, rabbit, (queue,), allow_actions=False))

    page = client.get(f"/dead-letters?queue={queue}")
    assert message_id in page.text
    assert "Read-only" in page.text
    assert "Replay" not in page.text
    assert 'action="/dead-letters/' not in page.text  # no form to act with
    attempts = [
        ("/dead-letters/replay", {"queue": queue, "id": message_id, "confirmed": "yes"}),
        ("/dead-letters/purge", {"queue": queue, "confirmed": "yes"}),
        (f"/effects/{key}/release", {"confirmed": "yes"}),
        (f"/effects/{key}/done", {"result": "{}", "confirmed": "yes"}),
        ("/outbox/drop", {"id": str(row), "confirmed": "yes"}),
        ("/outbox/retry", {"id": str(row)}),
        ("/claims/release", {"q": str(sms.message.id), "handler": SMS_HANDLER, "confirmed": "yes"}),
    ]
    csrf = csrf_of(page.text)  # the sign-out form's: right, and still refused
    for path, form in attempts:
        response = client.post(path, data={**form, "csrf": csrf})
        assert response.status_code == 403, path
        assert "read-only console" in response.text
    refusals = [line for line in audit_lines() if "action=refused" in line]
    assert len(refusals) == len(attempts)
    assert all("why='read-only'" in line for line in refusals)

    assert dlq_ids(rabbit, dead_letter_queue(queue)) == [message_id]
    assert client.get(f"/effects/{key}").status_code == 200
    assert row.hex in client.get("/outbox").text.replace("-", "")
    signed_out = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert signed_out.status_code == 303  # signing out changes nothing of the inbox's
    assert client.get("/", follow_redirects=False).status_code == 303


def test_an_action_without_the_pages_csrf_token_or_from_another_site_is_refused(
    pg_db: Database, rabbit: Rabbit
) -> None:
    row = refused_outbox_row(pg_db, rabbit, rabbit.queue("missing"))
    client = signed_in(settings(pg_db, rabbit))
    csrf = csrf_of(client.get("/outbox").text)
    form = {"id": str(row), "confirmed": "yes"}

    assert client.post("/outbox/drop", data=form).status_code == 403
    assert client.post("/outbox/drop", data={**form, "csrf": csrf + "x"}).status_code == 403
    elsewhere = client.post(
        "/outbox/drop", data={**form, "csrf": csrf}, headers={"origin": "http://evil.example"}
    )
    assert elsewhere.status_code == 403
    # A token from another session (or header auth's) is not this session's.
    other = signed_in(settings(pg_db, rabbit))
    assert other.post("/outbox/drop", data={**form, "csrf": csrf}).status_code == 403
    assert str(row) in client.get("/outbox").text

    dropped = client.post("/outbox/drop", data={**form, "csrf": csrf})
    assert dropped.status_code == 200
    assert "dropped 1 of 1" in dropped.text


def test_every_action_is_also_an_opentelemetry_span(pg_db: Database, rabbit: Rabbit) -> None:
    from support.telemetry import sdk

    installed = sdk()
    row = refused_outbox_row(pg_db, rabbit, rabbit.queue("missing"))
    client = signed_in(settings(pg_db, rabbit))
    csrf = csrf_of(client.get("/outbox").text)
    # Only this test's spans: an earlier test may have acted while the SDK was installed.
    installed.exporter.clear()
    client.post("/outbox/drop", data={"csrf": csrf, "id": str(row), "confirmed": "yes"})

    (span,) = [
        s
        for s in installed.spans("inbox.console.action", inbox__console__action="outbox.drop")
        if (s.attributes or {}).get("inbox.console.chosen") == 1
    ]
    attributes = dict(span.attributes or {})
    assert attributes["inbox.console.who"] == "token"
    assert attributes["inbox.console.count"] == 1
    assert [event.name for event in span.events] == ["inbox.audit"]


class _Probe(BaseHTTPRequestHandler):
    """A worker's /readyz: ready on one server, not on the other."""

    def do_GET(self) -> None:
        ready = self.server.server_address[1] == _Probe.ready_port  # type: ignore[attr-defined]
        body = b"ready" if ready else b"broker: not consuming\ndatabase: <script>x</script>"
        self.send_response(200 if ready else 503)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_overview_shows_each_workers_readiness(pg_db: Database) -> None:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Probe) for _ in range(2)]
    _Probe.ready_port = servers[0].server_address[1]  # type: ignore[attr-defined]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    urls.append(f"http://127.0.0.1:{closed}")
    try:
        workers = tuple(check_worker_url(url) for url in urls)
        assert workers[0] == urls[0] + "/readyz"
        client = signed_in(replace(settings(pg_db, None), workers=workers))
        listed = client.get("/").text.split('id="workers"')[1].split("</ul>")[0]
    finally:
        for server in servers:
            server.shutdown()
    ready, not_ready, down = listed.split("<li>")[1:]
    assert '<span class="ok">ready</span>' in ready
    assert "not ready" in not_ready
    assert "broker: not consuming" in not_ready
    assert "&lt;script&gt;" in not_ready
    assert "<script>" not in listed
    assert "unreachable" in down
    with pytest.raises(ValueError, match="http"):
        check_worker_url("file:///etc/passwd")


# --- dead letters --------------------------------------------------------------------------


def test_replay_one_dead_letter_after_a_preview_and_a_confirmation(
    pg_db: Database, rabbit: Rabbit, audit_lines: AuditLines
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    first = dead_letter(rabbit, queue, ref="a")
    second = dead_letter(rabbit, queue, ref="b", reason="invalid-body")
    client = signed_in(settings(pg_db, rabbit, (queue,)))

    listing = client.get(f"/dead-letters?queue={queue}")
    assert first in listing.text
    assert second in listing.text
    assert "handler-failed: 1" in listing.text
    assert "invalid-body: 1" in listing.text
    overview = client.get("/")
    assert 'id="dlq-depth-1">2<' in overview.text
    chart = overview.text.split('id="reasons-chart-1"')[1].split("</svg>")[0]
    assert "handler-failed" in chart
    assert "invalid-body" in chart
    refreshed = client.get("/overview/counts")  # what htmx swaps in every 15 s
    assert 'id="dlq-depth-1">2<' in refreshed.text
    assert "reasons-chart" not in refreshed.text  # depths only: no message read

    csrf = csrf_of(listing.text)
    preview = client.post("/dead-letters/replay", data={"csrf": csrf, "queue": queue, "id": first})
    assert "would replay 1 of 2 dead letters" in preview.text
    assert rabbit.depth(queue) == 0  # a preview moves nothing
    assert rabbit.depth(dead_letter_queue(queue)) == 2

    done = client.post("/dead-letters/replay", data=confirmation(preview.text))
    assert "replayed 1 of 2 dead letters" in done.text
    assert dlq_ids(rabbit, dead_letter_queue(queue)) == [second]
    (replayed,) = rabbit.take_all(queue)
    assert replayed.properties["message_id"] == first
    assert replayed.headers[REPLAYS] == 1
    assert h.REASON not in replayed.headers
    assert h.TRIES not in replayed.headers  # tries reset: it gets the worker's full retries

    asked = client.post(
        "/dead-letters/replay",
        data={"csrf": csrf, "queue": queue, "id": second, "keep_tries": "yes"},
    )
    kept = client.post("/dead-letters/replay", data=confirmation(asked.text))
    assert "replayed 1 of 1" in kept.text
    (again,) = rabbit.take_all(queue)
    assert again.headers[h.TRIES] == 3  # one more failure dead-letters it again
    assert any(
        "action=dlq.replay count=1" in line and "by='token'" in line for line in audit_lines()
    )


def test_purge_a_filtered_set(pg_db: Database, rabbit: Rabbit, audit_lines: AuditLines) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    for ref in ("a", "b"):
        dead_letter(rabbit, queue, ref=ref)
    kept = dead_letter(rabbit, queue, ref="c", reason="uncertain-effect")
    client = signed_in(settings(pg_db, rabbit, (queue,)))
    csrf = csrf_of(client.get(f"/dead-letters?queue={queue}").text)
    form = {"csrf": csrf, "queue": queue, "reason": "handler-failed"}

    preview = client.post("/dead-letters/purge", data=form)
    assert "would purge 2 of 3 dead letters" in preview.text
    assert "1 not matching the filters" in preview.text
    bad = client.post("/dead-letters/purge", data={**form, "reason": "nonsense"})
    assert bad.status_code == 400
    assert "unknown reason" in bad.text
    done = client.post("/dead-letters/purge", data=confirmation(preview.text))
    assert "purged 2 of 3" in done.text
    assert dlq_ids(rabbit, dead_letter_queue(queue)) == [kept]
    assert any("action=dlq.purge count=2" in line for line in audit_lines())


@pytest.mark.parametrize("command", ["replay", "purge"])
def test_a_confirmation_takes_only_what_its_preview_showed(
    pg_db: Database, rabbit: Rabbit, command: str
) -> None:
    """A dead letter that matches but arrived while the operator read the preview is left
    in place: the confirmed run reads no further than the preview did."""
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    shown = [dead_letter(rabbit, queue, ref=ref) for ref in ("a", "b")]
    client = signed_in(settings(pg_db, rabbit, (queue,)))
    csrf = csrf_of(client.get(f"/dead-letters?queue={queue}").text)
    form = {"csrf": csrf, "queue": queue, "reason": "handler-failed"}

    preview = client.post(f"/dead-letters/{command}", data=form)
    assert f"would {command} 2 of 2 dead letters" in preview.text
    late = dead_letter(rabbit, queue, ref="late")  # dead-lettered during the think time
    done = client.post(f"/dead-letters/{command}", data=confirmation(preview.text))
    assert done.status_code == 200, done.text
    done_verb = {"replay": "replayed", "purge": "purged"}[command]
    assert f"{done_verb} 2 of 3 dead letters" in done.text
    assert "1 not read (not read by the preview)" in done.text
    assert "bounded to the preview: the first 2 dead letters, at most 2 taken" in done.text
    assert dlq_ids(rabbit, dead_letter_queue(queue)) == [late]
    if command == "replay":
        assert [m.properties["message_id"] for m in rabbit.take_all(queue)] == shown

    unpreviewed = client.post(f"/dead-letters/{command}", data={**form, "confirmed": "yes"})
    assert unpreviewed.status_code == 400
    assert "no preview to confirm" in unpreviewed.text
    assert dlq_ids(rabbit, dead_letter_queue(queue)) == [late]


HOSTILE = b'<script>alert("owned")</script><img src=x onerror=alert(1)>'


def test_hostile_bodies_are_shown_as_text_capped_and_never_as_markup(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    scripted = dead_letter(
        rabbit, queue, HOSTILE + b"x" * 200_000, error='"><script>alert(2)</script>'
    )
    binary = dead_letter(rabbit, queue, b"\xff\xfe\x00<script>\x80\xc3")
    hostile_id = dead_letter(rabbit, queue, b"{}", message_id='"><script>alert(3)</script>')
    client = signed_in(settings(pg_db, rabbit, (queue,), max_body=1000))

    page = client.get("/dead-letters/message", params={"queue": queue, "id": scripted})
    assert page.status_code == 200
    assert "<script>alert" not in page.text
    assert "<img src=x" not in page.text
    assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in page.text
    assert f"{len(HOSTILE) + 200_000} bytes, the first 1000 shown" in page.text
    assert len(page.text) < 20_000

    raw = client.get("/dead-letters/message", params={"queue": queue, "id": binary})
    assert "as base64 (not UTF-8)" in raw.text
    assert base64.b64encode(b"\xff\xfe\x00<script>\x80\xc3").decode() in raw.text

    listing = client.get(f"/dead-letters?queue={queue}")
    assert "<script>alert" not in listing.text
    assert "&lt;script&gt;alert(3)" in listing.text
    by_id = client.get("/dead-letters/message", params={"queue": queue, "id": hostile_id})
    assert by_id.status_code == 200
    assert "<script>alert" not in by_id.text


def test_a_queue_not_given_to_the_console_is_not_shown(pg_db: Database, rabbit: Rabbit) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    client = signed_in(settings(pg_db, rabbit, (queue,)))
    response = client.get("/dead-letters?queue=someone-elses")
    assert response.status_code == 404
    missing = client.get("/dead-letters/message", params={"queue": queue, "id": "nope"})
    assert missing.status_code == 404


# --- effects -------------------------------------------------------------------------------


def test_an_uncertain_effect_marked_done_gives_the_retry_that_result_without_a_call(
    pg_db: Database, audit_lines: AuditLines
) -> None:
    sms = Sms(pg_db)
    key = sms.fail_once()
    client = signed_in(settings(pg_db, None))

    listing = client.get("/effects")
    assert str(key) in listing.text
    detail = client.get(f"/effects/{key}")
    assert 'id="status">failed<' in detail.text
    assert "provider timed out" in detail.text
    csrf = csrf_of(detail.text)
    not_json = client.post(f"/effects/{key}/done", data={"csrf": csrf, "result": "{nope"})
    assert not_json.status_code == 400
    assert "not JSON" in not_json.text
    preview = client.post(f"/effects/{key}/done", data={"csrf": csrf, "result": '{"id": "sms-9"}'})
    assert "mark effect" in preview.text
    assert 'id="status">failed<' in client.get(f"/effects/{key}").text  # nothing yet

    done = client.post(
        f"/effects/{key}/done", data={"csrf": csrf, "result": '{"id": "sms-9"}', "confirmed": "yes"}
    )
    assert done.status_code == 200
    assert 'id="status">done<' in client.get(f"/effects/{key}").text
    again = client.post(
        f"/effects/{key}/done", data={"csrf": csrf, "result": "1", "confirmed": "yes"}
    )
    assert again.status_code == 409  # done with its result: nothing uncertain left

    sms.process()
    assert sms.seen == [{"id": "sms-9"}]
    assert len(sms.calls) == 1  # the retry did not call the provider
    assert any("action=effect.done count=1" in line for line in audit_lines())


def test_an_uncertain_effect_released_is_called_again(pg_db: Database) -> None:
    sms = Sms(pg_db)
    key = sms.fail_once()
    client = signed_in(settings(pg_db, None))
    csrf = csrf_of(client.get(f"/effects/{key}").text)
    with pytest.raises(HandlerFailed) as failed:
        sms.process()  # at-most-once: no second call until a person decides
    assert isinstance(failed.value.failures[SMS_HANDLER], UncertainEffect)

    preview = client.post(f"/effects/{key}/release", data={"csrf": csrf})
    assert "calls again" in preview.text
    assert (
        client.post(f"/effects/{key}/release", data={"csrf": csrf, "confirmed": "yes"}).status_code
        == 200
    )
    assert client.get(f"/effects/{key}").status_code == 404

    sms.process()
    assert len(sms.calls) == 2
    assert sms.seen == [{"id": "sms-2"}]


# --- outbox --------------------------------------------------------------------------------


def test_a_refused_row_retried_now_goes_out_once_its_queue_exists(
    pg_db: Database, rabbit: Rabbit, audit_lines: AuditLines
) -> None:
    target = rabbit.queue("shipped")
    row = refused_outbox_row(pg_db, rabbit, target)
    client = signed_in(settings(pg_db, rabbit))
    page = client.get("/outbox")
    assert str(row) in page.text
    assert "NO_ROUTE" in page.text
    assert 'id="refused-count">1<' in page.text

    with open_channel(rabbit.url) as channel:
        channel.queue_declare(queue=target, durable=True, auto_delete=False)
    retried = client.post("/outbox/retry", data={"csrf": csrf_of(page.text), "id": str(row)})
    assert "1 of 1 chosen row(s) due now" in retried.text
    relay = Relay(pg_db.engine, rabbit.url, listen=False)
    try:
        assert relay.drain() == 1  # due now, not in up to --max-retry-delay
    finally:
        relay.close()
    assert rabbit.depth(target) == 1
    assert 'id="pending">0<' in client.get("/outbox").text
    assert any("action=outbox.retry count=1" in line for line in audit_lines())


def test_outbox_actions_refuse_bad_ids(pg_db: Database) -> None:
    client = signed_in(settings(pg_db, None))
    csrf = csrf_of(client.get("/outbox").text)
    assert client.post("/outbox/retry", data={"csrf": csrf}).status_code == 400
    bad = client.post("/outbox/retry", data={"csrf": csrf, "id": "1; DROP TABLE x"})
    assert bad.status_code == 400
    assert "not an outbox row id" in bad.text


# --- claims --------------------------------------------------------------------------------


def test_claims_by_message_id_or_business_key_and_release_one(pg_db: Database) -> None:
    inbox = Inbox(sessionmaker(pg_db.engine))
    inbox.handler("order.created", name="billing.invoice")(lambda m, s: None)
    inbox.handler("order.created", name="mail.confirm")(lambda m, s: None)
    plain = Message.new("order.created", {"ref": 1})
    keyed = Message.new("order.created", {"ref": 2}, {"idempotency-key": "order-2"})
    inbox.process(plain)
    inbox.process(keyed)
    client = signed_in(settings(pg_db, None))

    found = client.get("/claims", params={"q": str(plain.id)})
    assert "billing.invoice" in found.text
    assert "mail.confirm" in found.text
    by_key = client.get("/claims", params={"q": "order-2"})
    assert "billing.invoice" in by_key.text
    missing = client.get("/claims", params={"q": str(keyed.id)})
    assert 'id="not-found"' in missing.text
    assert "idempotency-key" in missing.text  # says where to look instead

    csrf = csrf_of(found.text)
    form = {"csrf": csrf, "q": str(plain.id), "handler": "billing.invoice"}
    preview = client.post("/claims/release", data=form)
    assert "Deletes 1 claim(s)" in preview.text
    client.post("/claims/release", data={**form, "confirmed": "yes"})
    left = client.get("/claims", params={"q": str(plain.id)})
    assert "billing.invoice" not in left.text
    assert "mail.confirm" in left.text
    claims = tables().claims
    with pg_db.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(claims)).scalar_one() == 3


@pytest.fixture
def tenants(pg_db: Database, admin_engines: dict[str, Engine]) -> Iterator[tuple[str, str]]:
    """Two tenant schemas holding the inbox's tables, on the test's server."""
    names = (f"t_{uuid.uuid4().hex[:12]}", f"t_{uuid.uuid4().hex[:12]}")
    with admin_engines["postgresql"].connect() as connection:
        for name in names:
            connection.execute(text(f"CREATE SCHEMA {name}"))
    for name in names:
        metadata = MetaData()
        for define in (inbox_table, effect_table, outbox_table):
            define(metadata, schema=name)
        metadata.create_all(pg_db.engine)
    yield names
    with admin_engines["postgresql"].connect() as connection:
        for name in names:
            connection.execute(text(f"DROP SCHEMA {name} CASCADE"))


def test_a_tenant_is_chosen_on_the_page_and_actions_stay_in_it(
    pg_db: Database, tenants: tuple[str, str], audit_lines: AuditLines
) -> None:
    first, second = tenants
    message_id = uuid.uuid4()
    claims = tables().in_schema(first).claims
    with pg_db.engine.begin() as connection:
        connection.execute(
            insert(claims).values(
                message_id=message_id,
                handler="billing.invoice",
                processed_at=dt.datetime.now(dt.UTC),
            )
        )
    client = signed_in(replace(settings(pg_db, None), schemas=tenants))

    page = client.get("/claims", params={"q": str(message_id)})
    assert f'<option value="{first}" selected>' in page.text
    assert "billing.invoice" in page.text
    csrf = csrf_of(page.text)
    assert client.post("/schema", data={"csrf": csrf, "schema": "public"}).status_code == 400
    assert client.post("/schema", data={"schema": second}).status_code == 403  # no CSRF
    switched = client.post("/schema", data={"csrf": csrf, "schema": second, "back": "/claims"})
    assert switched.url.path == "/claims"
    elsewhere = client.get("/claims", params={"q": str(message_id)})
    assert f'<option value="{second}" selected>' in elsewhere.text
    assert 'id="not-found"' in elsewhere.text

    form = {"csrf": csrf, "q": str(message_id), "handler": "billing.invoice", "confirmed": "yes"}
    in_second = client.post("/claims/release", data=form)  # the chosen schema: the second
    assert "released: 0 claim(s)" in in_second.text
    released = client.post("/claims/release", data={**form, "schema": first})
    assert "released: 1 claim(s)" in released.text
    assert any(f"schema='{first}'" in line and "count=1" in line for line in audit_lines())
    with pg_db.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(claims)).scalar_one() == 0


# --- the command ---------------------------------------------------------------------------


def run_inbox(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_needs_credentials_from_the_environment_or_a_file(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("INBOX_CONSOLE_TOKEN", raising=False)
    monkeypatch.delenv("INBOX_CONSOLE_PASSWORD", raising=False)
    code, _, err = run_inbox("console", "--database-url", pg_db.url)
    assert code == 2
    assert "the console needs credentials: set INBOX_CONSOLE_TOKEN" in err
    code, _, err = run_inbox("console", "--database-url", pg_db.url, "--token", TOKEN)
    assert code == 2  # no such option: a secret on the command line is not taken
    monkeypatch.setenv("INBOX_CONSOLE_TOKEN", "short")
    code, _, err = run_inbox("console", "--database-url", pg_db.url)
    assert code == 2
    assert "too short" in err
    assert "short" not in err.replace("too short", "")

    monkeypatch.setenv("INBOX_CONSOLE_TOKEN", TOKEN)
    sqlite = f"sqlite:///{tmp_path / 'inbox.db'}"
    code, _, err = run_inbox("console", "--database-url", sqlite, "--all-schemas")
    assert code == 2
    assert "SQLite has no schemas" in err
    code, _, err = run_inbox(
        "console", "--database-url", pg_db.url, "--schema", "a", "--table", "x.inbox_message"
    )
    assert code == 2
    assert "with schemas, table names are NAME, not SCHEMA.NAME" in err

    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        load_credentials(token_file=str(empty), environ={})
    empty.write_text(TOKEN + "\n")
    assert load_credentials(token_file=str(empty), environ={}).check_token(TOKEN)
    assert TOKEN not in repr(load_credentials(token_file=str(empty), environ={}))

    defaults = command_parsers()["inbox console"].parse_args([])
    assert defaults.host == "127.0.0.1"
    assert defaults.allow_actions is False


def test_inbox_console_serves_on_localhost_with_the_token_from_the_environment(
    pg_db: Database,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "INBOX_CONSOLE_TOKEN": TOKEN, "INBOX_DATABASE_URL": pg_db.url}
    command = "import sys; from inbox.admin import admin_main; sys.exit(admin_main())"
    process = subprocess.Popen(
        [sys.executable, "-c", command, "console", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == f"inbox console: http://127.0.0.1:{port}/ (read-only)\n", line + (
            process.stderr.read() if process.poll() is not None else ""
        )
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(url, headers={"authorization": f"Bearer {TOKEN}"})
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the console never answered"
                time.sleep(0.1)
        assert response.status_code == 200
        assert "Overview" in response.text
        assert httpx.get(url).status_code == 303  # no token: to the sign-in page
    finally:
        process.terminate()
        process.wait(timeout=30)
