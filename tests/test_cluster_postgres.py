"""PostgreSQL failover with a streaming standby the test starts (tools/cluster/postgres.py):
what synchronous replication guarantees an inbox, and what asynchronous replication loses.

The inbox acks a delivery once its claim has committed. A commit acknowledged by a primary
that then dies is safe only if the promoted standby has it. The standby is made to fall
behind on purpose (its WAL receiver frozen with SIGSTOP, then killed with the bytes it had
not written), so each outcome is deterministic rather than a race.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from support.databases import cannot_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster._process import ClusterError, wait_until
from tools.cluster.postgres import USER, PgNode, PostgresPair, pg_bin

pytestmark = pytest.mark.slow


def _pair(synchronous: bool) -> Iterator[PostgresPair]:
    try:
        binaries = pg_bin()
    except ClusterError as exc:
        cannot_run(str(exc))
    needed = ("initdb", "postgres", "pg_ctl", "pg_basebackup", "psql", "pg_isready")
    if missing := [b for b in needed if not (binaries / b).exists()]:
        cannot_run(f"PostgreSQL server binaries missing in {binaries}: {missing}")
    with PostgresPair(synchronous=synchronous) as pair:
        pair.sql(pair.primary, "CREATE TABLE claim (id int PRIMARY KEY)")
        # An asynchronous standby may not have replayed the table yet: a test that freezes
        # its WAL receiver now would promote a standby without it.
        wait_until(
            lambda: pair.sql(pair.standby, "SELECT to_regclass('claim') IS NOT NULL") == "t",
            timeout=30,
            what="the standby having the claim table",
        )
        yield pair


@pytest.fixture
def sync_pair() -> Iterator[PostgresPair]:
    """A primary and a synchronous (remote_apply) standby."""
    yield from _pair(synchronous=True)


@pytest.fixture
def async_pair() -> Iterator[PostgresPair]:
    """A primary and an asynchronous standby."""
    yield from _pair(synchronous=False)


def _connect(node: PgNode) -> psycopg.Connection[tuple[int]]:
    return psycopg.connect(host="127.0.0.1", port=node.port, user=USER, dbname="postgres")


def _freeze_wal_receiver(pair: PostgresPair) -> int:
    pid = int(pair.sql(pair.standby, "SELECT pid FROM pg_stat_wal_receiver"))
    os.kill(pid, signal.SIGSTOP)
    return pid


def _crash_and_promote(pair: PostgresPair, frozen_receiver: int) -> None:
    """Kill the primary, then the frozen receiver with whatever it had not written yet, and
    promote the standby (its server restarts the receiver's siblings, then takes over)."""
    pair.kill_primary()
    os.kill(frozen_receiver, signal.SIGKILL)
    # The standby's server restarts its processes after the receiver's crash, and a promote
    # request sent in the middle of that restart is dropped: wait until it serves again.
    time.sleep(1.0)
    wait_until(
        lambda: pair.sql(pair.standby, "SELECT pg_is_in_recovery()") == "t",
        timeout=60,
        what="the standby serving again",
    )
    pair.promote()


def _present(pair: PostgresPair, claim_id: int) -> bool:
    return pair.sql(pair.primary, f"SELECT count(*) FROM claim WHERE id = {claim_id}") == "1"


def test_a_synchronous_commit_is_on_the_standby_when_it_returns(sync_pair: PostgresPair) -> None:
    with _connect(sync_pair.primary) as connection:
        for claim_id in range(1, 31):
            connection.execute("INSERT INTO claim VALUES (%s)", (claim_id,))
            connection.commit()
            # remote_apply: the standby has applied it before COMMIT returned.
            assert (
                sync_pair.sql(
                    sync_pair.standby, f"SELECT count(*) FROM claim WHERE id = {claim_id}"
                )
                == "1"
            )
    assert sync_pair.replication_state() == [(sync_pair.standby.name, "streaming", "sync")]


def test_the_multi_host_url_follows_the_promoted_standby(sync_pair: PostgresPair) -> None:
    engine = create_engine(sync_pair.url(), pool_pre_ping=True)
    try:
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO claim VALUES (1)"))
            first_port = connection.execute(text("SELECT inet_server_port()")).scalar_one()
        unwritable = sync_pair.failover()
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO claim VALUES (2)"))
            rows = connection.execute(text("SELECT id FROM claim ORDER BY id")).scalars().all()
            port = connection.execute(text("SELECT inet_server_port()")).scalar_one()
    finally:
        engine.dispose()
    assert first_port != port == sync_pair.primary.port
    assert rows == [1, 2]
    assert unwritable < 30
    # The old primary came back as a synchronous standby of the new one.
    assert sync_pair.replication_state() == [(sync_pair.standby.name, "streaming", "sync")]


def test_a_synchronous_commit_the_standby_lacks_is_never_acknowledged(
    sync_pair: PostgresPair,
) -> None:
    receiver = _freeze_wal_receiver(sync_pair)
    outcome: list[object] = []

    def commit() -> None:
        try:
            with _connect(sync_pair.primary) as connection:
                connection.execute("INSERT INTO claim VALUES (7)")
                connection.commit()
            outcome.append("acknowledged")
        except psycopg.Error as exc:
            outcome.append(exc)

    writer = threading.Thread(target=commit)
    writer.start()
    writer.join(3.0)
    assert writer.is_alive(), f"COMMIT returned while the standby could not apply it: {outcome}"
    _crash_and_promote(sync_pair, receiver)
    writer.join(30)
    assert not writer.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], psycopg.OperationalError), outcome
    # Never acknowledged, so never acked to the broker: the delivery comes back and runs on
    # the new primary, which does not have the claim.
    assert not _present(sync_pair, 7)


def test_an_asynchronous_commit_acknowledged_before_the_standby_had_it_is_lost(
    async_pair: PostgresPair,
) -> None:
    receiver = _freeze_wal_receiver(async_pair)
    with _connect(async_pair.primary) as connection:
        connection.execute("INSERT INTO claim VALUES (7)")
        connection.commit()  # returns at once: the worker would ack the delivery now
    _crash_and_promote(async_pair, receiver)
    # The acknowledged claim (and its handler's effects) are gone, and so is the delivery:
    # a lost message. This is what asynchronous replication costs, measured in docs/cluster.md.
    assert not _present(async_pair, 7)
    assert async_pair.promotions == 1


def test_a_cancelled_synchronous_wait_acknowledges_a_commit_the_standby_lacks(
    sync_pair: PostgresPair,
) -> None:
    """The one hole in synchronous replication (documented in docs/cluster.md): a COMMIT
    whose wait for the standby is cancelled (``pg_cancel_backend``) returns success with a
    warning only. A worker would ack it; if the primary then dies, the message is lost."""
    receiver = _freeze_wal_receiver(sync_pair)
    notices: list[str | None] = []
    with _connect(sync_pair.primary) as connection:
        connection.add_notice_handler(lambda notice: notices.append(notice.message_primary))
        backend = connection.info.backend_pid
        connection.execute("INSERT INTO claim VALUES (7)")
        cancel = threading.Timer(
            1.0, sync_pair.sql, (sync_pair.primary, f"SELECT pg_cancel_backend({backend})")
        )
        cancel.start()
        connection.commit()  # returns: no error reaches the caller
        cancel.join()
    assert any("canceling wait for synchronous replication" in (n or "") for n in notices)
    _crash_and_promote(sync_pair, receiver)
    assert not _present(sync_pair, 7)
