"""The seams between features: one test per pair of features that meet on a message, each
run against the real servers and asserting the end state (rows, calls, broker messages),
never the calls made between them.

Each pair here once broke where the two met although each held on its own (issue 24): the
test names the pair first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import nats
import pytest
from faststream.nats import NatsBroker
from faststream.rabbit import RabbitBroker
from sqlalchemy import (
    Engine,
    Interval,
    Table,
    create_engine,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from support.aio import async_engine, run
from support.databases import Database, effects, effects_metadata
from support.effects import order, record_effect
from support.ledger import Provider, effect_store, records, store_of
from support.nats import jetstream_url
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until

from inbox import EffectError, HandlerFailed, Inbox, Message, Outbox, Outcome
from inbox.admin import admin_main
from inbox.aio import AsyncInbox
from inbox.broker import Publisher, Relay, RetryPolicy, Worker
from inbox.delivery import headers as h
from inbox.faststream import subscribe_nats_stream, subscribe_rabbit
from inbox.schema import inbox_effect, inbox_message, outbox_message
from inbox.schema import metadata as inbox_metadata

TIMEOUT = 60.0


@pytest.fixture
def running() -> Iterator[list[Worker]]:
    """Workers a test starts in threads, stopped after it."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def start(running: list[Worker], worker: Worker) -> Worker:
    running.append(worker)
    run_in_thread(worker)
    return worker


# --- replay x retention ------------------------------------------------------------------


def shift_dead_letters(rabbit: Rabbit, dlq: str, by: dt.timedelta) -> None:
    """Every dead letter of ``dlq`` as it would be ``by`` later: its time headers moved back
    (taken and published again, confirmed)."""
    with rabbit.connection() as connection:
        connection.connect()
        channel = connection.connection.channel()
        channel.confirm_select()
        for _ in range(rabbit.depth(dlq)):  # each once: the shifted copies go to the end
            message = channel.basic_get(dlq, no_ack=False)
            headers = dict(message.properties.get("application_headers") or {})
            for name, value in headers.items():
                if name.startswith("x-inbox-") and name.endswith(("-at", "failure")):
                    moved = dt.datetime.fromisoformat(value) - by
                    headers[name] = moved.isoformat(timespec="milliseconds")
            properties = {**message.properties, "application_headers": headers}
            channel.basic_publish_confirm(
                amqp.Message(message.body, **properties), exchange="", routing_key=dlq
            )
            channel.basic_ack(message.delivery_tag)


def inbox_command(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_replay_x_retention_a_replayed_dead_letter_keeps_the_age_cleanup_must_respect(
    pg_db: Database, rabbit: Rabbit, running: list[Worker]
) -> None:
    """Regression: a replay removed the failure headers, so a foreign (UUIDv4) message that
    failed again was dated by its new first failure; cleanup then deleted the claims of its
    first delivery, and the next replay charged the order a second time."""
    queue, dlq = rabbit.queue("orders"), rabbit.queue("orders.dlq")
    mail_down = [True]
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("order.placed", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        record_effect(message, session, "billing.charge")

    @inbox.handler("order.placed", name="mail.confirm")
    def confirm(message: Message, session: Session) -> None:
        if mail_down[0]:
            raise RuntimeError("mail server down")
        record_effect(message, session, "mail.confirm")

    worker = start(
        running, Worker(inbox, rabbit.url, [queue], retry=RetryPolicy(max_tries=1), prefetch=1)
    )
    wait_until(lambda: worker.consuming, "the worker to consume", TIMEOUT)
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("order.placed", {"ref": "order-1"}, message_id=uuid.uuid4())
    wait_until(lambda: rabbit.depth(dlq) == 1, "the first dead letter", TIMEOUT)

    # Ten days go by: the charge's claim and the dead letter's times are ten days old.
    ten_days = dt.timedelta(days=10)
    with pg_db.engine.begin() as connection:
        connection.execute(
            update(inbox_message).values(
                processed_at=inbox_message.c.processed_at - literal(ten_days, Interval())
            )
        )
    shift_dead_letters(rabbit, dlq, ten_days)

    for replays in (1, 2):  # replayed, and dead-lettered again: the mail server is still down
        inbox_command("dlq", "replay", "--queue", queue, "--broker", rabbit.url)
        wait_until(
            lambda n=replays: worker.stats.dead_lettered == 1 + n, "the dead letter", TIMEOUT
        )
        wait_until(lambda: rabbit.depth(dlq) == 1, "the dead letter in place", TIMEOUT)

    inbox_command(
        "cleanup", "--days", "3", "--database-url", pg_db.url, "--broker", rabbit.url,
        "--queue", queue, "--quiet",
    )  # fmt: skip

    mail_down[0] = False
    inbox_command("dlq", "replay", "--queue", queue, "--broker", rabbit.url)
    wait_until(lambda: ("order-1", "mail.confirm") in pg_db.effect_counts(), "the mail", TIMEOUT)
    wait_until(lambda: worker.stats.acked >= 4, "the replayed copy acked", TIMEOUT)
    assert pg_db.effect_counts() == {
        ("order-1", "billing.charge"): 1,
        ("order-1", "mail.confirm"): 1,
    }
    assert rabbit.depth(dlq) == 0
    assert rabbit.depth(queue) == 0


# --- tenants x effects -------------------------------------------------------------------


@pytest.fixture
def pg_tenant_schemas(pg_db: Database) -> Iterator[dict[str, Engine]]:
    """Two tenant schemas beside the test's own, reached through ONE engine, each tenant's
    sessions translating the unqualified tables (claims, effects, outbox, writes) to it."""
    own = make_url(pg_db.url).query["options"].removeprefix("-csearch_path=")
    names = [f"{own}_{tenant}" for tenant in ("a", "b")]
    engines: dict[str, Engine] = {}
    with pg_db.engine.begin() as connection:
        for name in names:
            connection.execute(text(f"CREATE SCHEMA {name}"))
    try:
        for tenant, name in zip(("tenant_a", "tenant_b"), names, strict=True):
            engines[tenant] = pg_db.engine.execution_options(schema_translate_map={None: name})
            inbox_metadata.create_all(engines[tenant])
            effects_metadata.create_all(engines[tenant])
        yield engines
    finally:
        with pg_db.engine.begin() as connection:
            for name in names:
                connection.execute(text(f"DROP SCHEMA {name} CASCADE"))


def tenant_of(engines: dict[str, Engine]) -> Any:
    sessions = {tenant: sessionmaker(engine) for tenant, engine in engines.items()}
    return lambda message: sessions[message.headers["tenant"]]()


def rows(engine: Engine, table: Table) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(select(table))]


def test_tenants_x_effects_the_same_message_is_one_call_per_tenant_each_under_its_own_key(
    pg_tenant_schemas: dict[str, Engine],
) -> None:
    engines = pg_tenant_schemas
    inbox = Inbox(sessions_for=tenant_of(engines))
    provider = Provider()
    failing = {"tenant_b": 1}

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        receipt = inbox.effect("provider.send", provider.send)
        record_effect(message, session, receipt["key"])
        tenant = message.headers["tenant"]
        if failing.get(tenant):
            failing[tenant] -= 1
            raise RuntimeError("the follow-up failed")

    shared = uuid.uuid4()
    deliveries = [Message(shared, "sms.requested", {"ref": t}, {"tenant": t}) for t in engines]
    outcomes = []
    for message in [*deliveries, *deliveries, *deliveries]:
        try:
            outcomes.append(inbox.process(message).outcome)
        except HandlerFailed:
            outcomes.append(None)

    assert outcomes == [
        Outcome.PROCESSED, None,  # B failed after its call...
        Outcome.DUPLICATE, Outcome.PROCESSED,  # ...and its retry got its stored result
        Outcome.DUPLICATE, Outcome.DUPLICATE,
    ]  # fmt: skip
    assert len(provider.calls) == 2
    assert len(set(provider.calls)) == 2  # one key per tenant
    for tenant, engine in engines.items():
        [record] = rows(engine, inbox_effect)
        assert (record["status"], record["attempts"]) == ("done", 1)
        [write] = rows(engine, effects)
        assert (write["ref"], write["handler"]) == (tenant, str(record["effect_key"]))


@pytest.fixture
def pg_search_path_tenants(pg_db: Database) -> Iterator[dict[str, Engine]]:
    """Two tenants in two schemas of one database, an engine each with the schema as its
    connect options' search_path (``options=-csearch_path=...``): nothing else tells them
    apart, no schema map, no ``inbox_tenant``."""
    own = make_url(pg_db.url).query["options"].removeprefix("-csearch_path=")
    names = {tenant: f"{own}_{tenant}" for tenant in ("tenant_a", "tenant_b")}
    with pg_db.engine.begin() as connection:
        for name in names.values():
            connection.execute(text(f"CREATE SCHEMA {name}"))
    url = make_url(pg_db.url)
    engines = {
        tenant: create_engine(url.update_query_dict({"options": f"-csearch_path={name}"}))
        for tenant, name in names.items()
    }
    try:
        for engine in engines.values():
            inbox_metadata.create_all(engine)
            effects_metadata.create_all(engine)
        yield engines
    finally:
        for engine in engines.values():
            engine.dispose()
        with pg_db.engine.begin() as connection:
            for name in names.values():
                connection.execute(text(f"DROP SCHEMA {name} CASCADE"))


def test_tenants_x_effects_search_path_tenants_get_a_key_each_without_being_named(
    pg_search_path_tenants: dict[str, Engine],
) -> None:
    """Regression (issue 32, item 5): tenants told apart only by their connections'
    search_path shared one effect key: a provider deduplicating by it dropped B's SMS."""
    engines = pg_search_path_tenants
    inbox = Inbox(sessions_for=tenant_of(engines))
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        receipt = inbox.effect("provider.send", provider.send)
        record_effect(message, session, receipt["key"])

    shared = uuid.uuid4()
    deliveries = [Message(shared, "sms.requested", {"ref": t}, {"tenant": t}) for t in engines]
    assert [inbox.process(m).outcome for m in [*deliveries, *deliveries]] == [
        Outcome.PROCESSED, Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.DUPLICATE,
    ]  # fmt: skip
    assert len(provider.calls) == 2
    assert len(set(provider.calls)) == 2  # one key per tenant
    for tenant, engine in engines.items():
        [record] = rows(engine, inbox_effect)  # each tenant's record in its own schema
        assert (record["status"], record["attempts"]) == ("done", 1)
        [write] = rows(engine, effects)
        assert (write["ref"], write["handler"]) == (tenant, str(record["effect_key"]))


# --- tenants x outbox --------------------------------------------------------------------


def test_tenants_x_outbox_a_follow_up_is_written_in_its_tenants_outbox_only_and_only_once(
    pg_tenant_schemas: dict[str, Engine],
) -> None:
    engines = pg_tenant_schemas
    inbox = Inbox(sessions_for=tenant_of(engines))
    outbox = Outbox()
    failing = {"tenant_b": 1}

    @inbox.handler("order.created", name="orders.confirm")
    def confirm(message: Message, session: Session) -> None:
        tenant = message.headers["tenant"]
        outbox.publish(
            session, "order.confirmed", {"ref": message.body["ref"]}, routing_key="confirmations"
        )
        if failing.get(tenant):
            failing[tenant] -= 1
            raise RuntimeError("failed after publishing")

    shared = uuid.uuid4()
    for _ in range(2):
        for tenant in engines:
            with contextlib.suppress(HandlerFailed):
                inbox.process(
                    Message(shared, "order.created", {"ref": f"{tenant}-1"}, {"tenant": tenant})
                )

    for tenant, engine in engines.items():
        [row] = rows(engine, outbox_message)
        assert json.loads(row["body"]) == {"ref": f"{tenant}-1"}
        assert row["type"] == "order.confirmed"
        [claim] = rows(engine, inbox_message)
        assert claim["message_id"] == shared


# --- relay x tenants' schemas ------------------------------------------------------------


def test_relay_x_tenant_schemas_each_relay_sends_its_tenants_rows_and_no_other(
    pg_db: Database, pg_tenant_schemas: dict[str, Engine], rabbit: Rabbit
) -> None:
    engines = pg_tenant_schemas
    queue = rabbit.queue("confirmations")
    with rabbit.connection() as connection, connection.channel() as channel:
        channel.queue_declare(queue=queue, durable=True, auto_delete=False)
    sent: dict[str, list[uuid.UUID]] = {}
    for tenant, engine in engines.items():
        with Session(engine) as session, session.begin():
            sent[tenant] = [
                Outbox().publish(session, "order.confirmed", {"n": n}, routing_key=queue)
                for n in range(3)
            ]

    schemas = {
        t: e.get_execution_options()["schema_translate_map"][None] for t, e in engines.items()
    }
    relayed: dict[str, int] = {}
    for tenant in engines:
        with Relay(pg_db.engine, rabbit.url, table=f"{schemas[tenant]}.outbox_message",
                   stats_interval=None) as relay:  # fmt: skip
            relayed[tenant] = relay.drain()

    assert relayed == {"tenant_a": 3, "tenant_b": 3}
    for engine in engines.values():
        assert rows(engine, outbox_message) == []
    got = [uuid.UUID(m.properties["message_id"]) for m in rabbit.take_all(queue)]
    assert sorted(got) == sorted(sent["tenant_a"] + sent["tenant_b"])


# --- batch handlers x effects ------------------------------------------------------------


def test_batch_handlers_x_effects_an_effect_in_a_batch_handler_is_refused_with_nothing_made(
    db: Database, tmp_path: Path
) -> None:
    """An effect is keyed by one message's claim; a batch handler has many. Refused in a
    batch and in process()'s one-element call alike: nothing called, recorded or committed."""
    store = effect_store(db, tmp_path)
    inbox = Inbox(db.sessions, effect_store=store)
    provider = Provider()

    @inbox.batch_handler("sms.requested", name="sms.bulk")
    def send_all(messages: list[Message], session: Session) -> None:
        for message in messages:
            record_effect(message, session, "sms.bulk")
            inbox.effect("provider.send", provider.send)

    messages = [order(f"m{n}", "sms.requested") for n in range(3)]
    try:
        results = [*inbox.process_batch(messages)]
        with pytest.raises(HandlerFailed) as alone:
            inbox.process(order("m9", "sms.requested"))
    finally:
        if store is not None:
            store.dispose()
    failures = [r.failures["sms.bulk"] for r in results if isinstance(r, HandlerFailed)]
    assert len(failures) == 3
    assert all(isinstance(f, EffectError) for f in failures)
    assert isinstance(alone.value.failures["sms.bulk"], EffectError)
    assert provider.calls == []
    assert records(store_of(db, store)) == []
    assert db.effect_counts() == {}
    assert db.count(inbox_message) == 0


# --- middleware x effects ----------------------------------------------------------------


def test_middleware_x_effects_effects_in_a_layer_and_its_handler_are_made_once_per_claim(
    db: Database, tmp_path: Path
) -> None:
    """A middleware's own effect and the handler's are two effects of one handler run, keyed
    by the claim taken under the delivered message, whatever copy the layer passes on."""
    store = effect_store(db, tmp_path)
    provider = Provider()
    failing = [1]
    inbox: Inbox

    def audit(message: Message, session: Session, call_next: Any) -> Any:
        inbox.effect("audit.notify", provider.send)
        enriched = dataclasses.replace(message, id=uuid.uuid4())  # a new id every attempt
        return call_next(enriched)

    inbox = Inbox(db.sessions, effect_store=store, middleware=[audit])

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        receipt = inbox.effect("provider.send", provider.send)
        session.execute(insert(effects).values(ref=receipt["id"], handler="sms.send"))
        if failing[0]:
            failing[0] -= 1
            raise RuntimeError("failed after both calls")

    message = order("m1", "sms.requested")
    try:
        with pytest.raises(HandlerFailed):
            inbox.process(message)
        assert inbox.process(message).outcome is Outcome.PROCESSED
        assert inbox.process(message).outcome is Outcome.DUPLICATE
        stored = records(store_of(db, store))
    finally:
        if store is not None:
            store.dispose()
    assert len(provider.calls) == 2
    assert len(set(provider.calls)) == 2
    assert {(r["step"], r["status"], r["attempts"]) for r in stored} == {
        ("audit.notify", "done", 1),
        ("provider.send", "done", 1),
    }
    assert {r["claim_key"] for r in stored} == {message.id}
    assert db.effect_counts() == {("sms-2", "sms.send"): 1}


# --- typed bodies x dead letters ---------------------------------------------------------


def as_bytes(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


@dataclasses.dataclass(frozen=True)
class Order:
    ref: str
    total: int


def test_typed_bodies_x_dead_letters_the_dead_letter_keeps_the_body_as_it_came(
    pg_db: Database, rabbit: Rabbit, running: list[Worker]
) -> None:
    """A body that is not a valid Order is dead-lettered at once (invalid-body), and one
    whose handler keeps failing after its tries (handler-failed): both with the bytes that
    came, never the typed body re-encoded, so a replay after the fix processes them."""
    queue, dlq = rabbit.queue("orders"), rabbit.queue("orders.dlq")
    fixed = [False]
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("order.created", name="orders.create", body=Order)
    def create(message: Message[Order], session: Session) -> None:
        if message.body.total > 100 and not fixed[0]:
            raise RuntimeError("over the limit")
        session.execute(insert(effects).values(ref=message.body.ref, handler="orders.create"))

    worker = start(
        running,
        Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.05,), max_tries=2), prefetch=1),
    )
    wait_until(lambda: worker.consuming, "the worker to consume", TIMEOUT)
    raw = {
        "o-1": b'{"total": 5,   "ref": "o-1", "note": "kept"}',
        "o-2": b'{"ref": "o-2", "total": "lots"}',
        "o-3": b'{"total": 500, "ref": "o-3"}',
    }
    with rabbit.connection() as connection:
        producer = connection.Producer()
        for body in raw.values():
            producer.publish(
                body, routing_key=queue, content_type="application/json",
                content_encoding="utf-8", type="order.created", message_id=str(uuid.uuid4()),
            )  # fmt: skip
    wait_until(lambda: rabbit.depth(dlq) == 2, "two dead letters", TIMEOUT)

    with rabbit.connection() as connection:
        connection.connect()
        channel = connection.connection.channel()
        letters = {}
        for _ in range(2):
            got = channel.basic_get(dlq, no_ack=False)
            letters[got.properties["application_headers"][h.REASON]] = got
        channel.close()  # unacked: both back in the .dlq
    assert as_bytes(letters["invalid-body"].body) == raw["o-2"]
    assert as_bytes(letters["handler-failed"].body) == raw["o-3"]
    assert letters["handler-failed"].properties["application_headers"][h.TRIES] == 2

    fixed[0] = True
    wait_until(lambda: rabbit.depth(dlq) == 2, "the dead letters back", TIMEOUT)
    inbox_command("dlq", "replay", "--queue", queue, "--broker", rabbit.url)
    wait_until(lambda: rabbit.depth(dlq) == 1, "o-2 dead-lettered again", TIMEOUT)
    wait_until(lambda: ("o-3", "orders.create") in pg_db.effect_counts(), "o-3", TIMEOUT)
    assert pg_db.effect_counts() == {("o-1", "orders.create"): 1, ("o-3", "orders.create"): 1}
    [again] = rabbit.take_all(dlq)
    assert again.headers[h.REASON] == "invalid-body"
    assert as_bytes(again.body) == raw["o-2"]


# --- async x effects under a small pool ---------------------------------------------------


def test_async_x_effects_under_a_small_pool_more_deliveries_at_once_than_connections(
    pg_db: Database, rabbit: Rabbit
) -> None:
    """FastStream with prefetch 8 over a pool of 2: every delivery makes one SMS through
    inbox.effect. Each is acked once, each SMS made once, nothing dead-lettered (the ledger
    wedged the pool: every delivery waited out the pool's timeout)."""
    queue = rabbit.queue("sms")
    provider = Provider()
    refs = [f"s{n}" for n in range(16)]

    async def main() -> Any:
        async with async_engine(pg_db, "psycopg", pool_size=2, max_overflow=0,
                                pool_timeout=10) as engine:  # fmt: skip
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("op", name="sms.send")
            async def send(message: Message, session: AsyncSession) -> None:
                async def call(key: uuid.UUID) -> dict[str, Any]:
                    await asyncio.sleep(0.01)  # the provider's answer takes a while
                    return provider.send(key)

                receipt = await inbox.effect("provider.send", call)
                await session.execute(
                    insert(effects).values(ref=message.body["ref"], handler=receipt["id"])
                )

            broker = RabbitBroker(rabbit.url, logger=None)
            subscription = subscribe_rabbit(broker, inbox, queue, prefetch=8)
            await broker.start()
            try:
                with Publisher(rabbit.url, routing_key=queue) as publisher:
                    await asyncio.to_thread(
                        lambda: [publisher.publish("op", {"ref": ref}) for ref in refs]
                    )
                deadline = asyncio.get_running_loop().time() + TIMEOUT
                while subscription.stats.acked < len(refs):
                    assert asyncio.get_running_loop().time() < deadline, subscription.stats
                    await asyncio.sleep(0.05)
            finally:
                await broker.stop()
            return subscription.stats

    stats = run(main())
    assert (stats.acked, stats.processed, stats.retried, stats.dead_lettered) == (16, 16, 0, 0)
    assert len(provider.calls) == 16
    assert len(set(provider.calls)) == 16
    assert sorted(ref for ref, _ in pg_db.effect_counts()) == sorted(refs)
    assert {r["status"] for r in records(pg_db.engine)} == {"done"}
    assert rabbit.depth(f"{queue}.dlq") == 0


# --- NATS x dead letters -----------------------------------------------------------------


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """A JetStream server of this module's own; a missing nats-server fails in CI."""
    with jetstream_url(first_port=4701) as url:
        yield url


async def nats_dead_letters(url: str, stream: str) -> list[dict[str, str]]:
    """The headers of every message in the dead-letter ``stream``."""
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        seqs = range(info.state.first_seq, info.state.last_seq + 1)
        return [{k: str(v) for k, v in ((await js.get_msg(stream, s)).headers or {}).items()}
                for s in seqs]  # fmt: skip
    finally:
        await client.close()


def test_nats_x_dead_letters_a_nats_dead_letter_says_what_a_rabbitmq_one_says(
    pg_db: Database, rabbit: Rabbit, nats_url: str
) -> None:
    """Regression (issue 32): a NATS retry is a NAK, which carries no headers, so a NATS
    dead letter's first failure was its last, and the retention guard and the console,
    which date and explain dead letters by these headers, saw a message that failed once.
    The same poison message through both FastStream edges, same policy: the same
    ``x-inbox-*`` headers, each dated by its first failure."""
    tag = uuid.uuid4().hex[:8]
    queue, dlq = rabbit.queue("orders"), rabbit.queue("orders.dlq")
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    policy = RetryPolicy((0.3,), max_tries=3)

    async def until_dead(subscriptions: list[Any]) -> None:
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while any(s.stats.dead_lettered < 1 for s in subscriptions):
            assert asyncio.get_running_loop().time() < deadline, "no dead letter in time"
            await asyncio.sleep(0.02)

    async def main() -> None:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.placed", name="billing.charge")
            async def charge(message: Message, session: AsyncSession) -> None:
                raise RuntimeError("card declined")

            on_rabbit = RabbitBroker(rabbit.url, logger=None)
            on_nats = NatsBroker(nats_url, logger=None)
            subscriptions = [
                subscribe_rabbit(on_rabbit, inbox, queue, retry=policy),
                subscribe_nats_stream(
                    on_nats, inbox, subject, stream=stream, durable="billing", retry=policy
                ),
            ]
            async with on_rabbit, on_nats:
                await on_rabbit.start()
                await on_nats.start()
                await on_rabbit.publish(
                    {"ref": "r"}, queue, message_id=str(uuid.uuid4()), message_type="order.placed"
                )
                headers = {"message_id": str(uuid.uuid4()), "type": "order.placed"}
                await on_nats.publish({"ref": "n"}, subject, headers=headers, stream=stream)
                await until_dead(subscriptions)

    run(main())

    [from_rabbit] = [{k: str(v) for k, v in m.headers.items()} for m in rabbit.take_all(dlq)]
    [from_nats] = run(nats_dead_letters(nats_url, f"{stream}_dlq"))

    def ours(headers: dict[str, str]) -> set[str]:
        return {name for name in headers if name.startswith("x-inbox-")}

    assert ours(from_nats) == ours(from_rabbit)
    for letter in (from_rabbit, from_nats):
        assert letter[h.TRIES] == "3"
        assert letter[h.REASON] == "handler-failed"
        first = h.parse_time(letter[h.FIRST_FAILURE])
        last = h.parse_time(letter[h.LAST_FAILURE])
        assert first is not None
        assert last is not None
        assert (last - first).total_seconds() >= 0.5  # two retries of 0.3 s apart
        assert h.earliest_failure(letter) == first  # what the retention guard dates it by
