"""A three-node RabbitMQ cluster the test starts (tools/cluster/rabbit.py), quorum queues:
the publisher and the worker take every node's URL and carry on when the node they use,
the queue's leader, crashes or stops; nothing confirmed is lost, nothing runs twice."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, func, insert, select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import cannot_run
from support.worker import run_in_thread, wait_until

from inbox import Inbox, Message
from inbox.broker import Publisher, Worker
from inbox.errors import PublishError
from inbox.schema import metadata as inbox_metadata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster.rabbit import RABBIT_BIN, RabbitCluster

pytestmark = pytest.mark.slow

effect_metadata = MetaData()
effect = Table("cluster_effect", effect_metadata, Column("n", Integer, nullable=False))


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    """Three clustered nodes for the whole module (about 12 s to start)."""
    if not (RABBIT_BIN / "rabbitmq-server").exists():
        cannot_run(f"rabbitmq-server not installed in {RABBIT_BIN}")
    with RabbitCluster() as started:
        yield started


@pytest.fixture
def vhost(cluster: RabbitCluster) -> Iterator[str]:
    """A vhost of the test's own; every node must be back in the cluster afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.ctl("add_vhost", name)
    cluster.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    yield name
    for node in cluster.nodes:
        if not node.running:
            cluster.start_node(node.name)
    cluster.ctl("delete_vhost", name)


def _publish(publisher: Publisher, n: int) -> uuid.UUID:
    for _ in range(20):  # the publisher's own reconnects may not outlast a node's crash
        try:
            return publisher.publish("n", {"n": n})
        except PublishError:
            time.sleep(0.5)
    raise AssertionError(f"message {n} could not be published in 20 tries")


def test_confirmed_messages_survive_the_leader_crash_and_the_publisher_fails_over(
    cluster: RabbitCluster, vhost: str
) -> None:
    first = cluster.nodes[0]
    with Connection(first.amqp_url(vhost)) as connection, connection.channel() as channel:
        channel.queue_declare(
            "q", durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )
    leader = cluster.leader("q", vhost)
    assert leader == first.name  # declared through node 1: the leader is local to it
    sent: list[uuid.UUID] = []
    with Publisher(cluster.url(vhost), routing_key="q") as publisher:
        sent += [_publish(publisher, n) for n in range(50)]
        assert publisher.connection.as_uri().startswith(
            f"amqp://guest:**@127.0.0.1:{first.amqp_port}"
        )
        cluster.kill_node(leader)
        sent += [_publish(publisher, n) for n in range(50, 100)]
        assert f":{first.amqp_port}/" not in publisher.connection.as_uri()
    assert cluster.leader("q", vhost) != leader
    received: Counter[str] = Counter()
    with Connection(cluster.url(vhost)) as connection, connection.channel() as channel:
        while (raw := channel.basic_get("q", no_ack=True)) is not None:
            received[raw.properties["message_id"]] += 1
    # Every confirmed message is there; a re-send after a lost confirm may be there twice
    # (under the same id, which the inbox deduplicates).
    assert set(received) == {str(i) for i in sent}
    cluster.start_node(leader)
    assert len(cluster.running_nodes()) == 3


def test_a_worker_carries_on_when_its_node_stops_and_runs_each_message_once(
    cluster: RabbitCluster, vhost: str, tmp_path: Path
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'inbox.db'}")
    inbox_metadata.create_all(engine)
    effect_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("n", name="cluster.effect")
    def apply(message: Message, session: Session) -> None:
        session.execute(insert(effect).values(n=int(message.body["n"])))
        time.sleep(0.02)  # slow enough that the node stops mid-run

    worker = Worker(inbox, cluster.url(vhost), ["work"], queue_type="quorum", prefetch=20)
    worker.prepare()
    with Publisher(cluster.url(vhost), routing_key="work") as publisher:
        for n in range(300):
            _publish(publisher, n)
    runner = run_in_thread(worker, idle_timeout=8.0)
    wait_until(lambda: worker.stats.acked >= 60, "60 messages acked", timeout=60)
    stopped = cluster.nodes[0]  # first in the URL list: the worker's node, and the leader's
    cluster.stop_node(stopped.name)
    assert worker.stats.acked < 300, "the node must stop while the worker is busy"
    runner.join(180)
    assert not runner.is_alive()
    cluster.start_node(stopped.name)
    with engine.connect() as connection:
        counts = dict(
            connection.execute(select(effect.c.n, func.count()).group_by(effect.c.n)).all()
        )
    engine.dispose()
    assert counts == dict.fromkeys(range(300), 1)  # none lost, none doubled
    assert worker.stats.acked >= 300
