"""The NATS edge where JetStream or the bucket answers something unexpected, on a real
``nats-server -js`` the test starts (tools/cluster/jetstream.py): a retry history that is
not a JSON object is ignored with a warning, a consumer check that fails is tried again on
the next delivery while the deliveries go on, a dead letter whose body alone passes
``max_payload`` goes with its body dropped, and only the errors the transport expects are
taken for "not connected" or "not from JetStream"."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.aio.msg import Msg
from support.aio import run
from support.databases import cannot_run

from inbox.faststream._nats_consumer import RetryHistory
from inbox.faststream._nats_transport import NatsTransport, _metadata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster.jetstream import NATS_SERVER, NatsCluster

WAIT = 60.0


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """One JetStream server for the module; a missing nats-server skips locally, fails in CI."""
    if not Path(NATS_SERVER).exists():
        cannot_run(f"nats-server not installed ({NATS_SERVER})")
    with NatsCluster(1, first_port=4901) as server:
        yield server.urls()[0]


def test_only_not_connected_and_not_from_jetstream_are_taken_as_such(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker not connected has no ``max_payload`` and is not closed; a core NATS message
    has no JetStream metadata. Anything else raised there is a bug and comes out: taken for
    "not connected", it would turn the trimming of dead letters off."""

    def broken(self: object) -> Any:
        raise ZeroDivisionError("a bug")

    async def main() -> Any:
        broker = NatsBroker(nats_url, logger=None)
        history = RetryHistory(broker, "orders", "inbox", 1)
        transport = NatsTransport(broker, "orders", "orders_dlq", history)
        before = transport.max_payload(), transport.closed()
        async with broker:
            await broker.connect()
            during = transport.max_payload(), transport.closed()
            subscription = await broker.connection.subscribe("core")
            await broker.connection.publish("core", b"{}")
            core = await subscription.next_msg(timeout=WAIT)
            delivered = SimpleNamespace(raw_message=core)
            found = _metadata(delivered)  # type: ignore[arg-type]
            with monkeypatch.context() as patch:
                patch.setattr(Client, "max_payload", property(broken))
                patch.setattr(Client, "is_closed", property(broken))
                patch.setattr(Msg, "metadata", property(broken))
                with pytest.raises(ZeroDivisionError):
                    transport.max_payload()
                with pytest.raises(ZeroDivisionError):
                    transport.closed()
                with pytest.raises(ZeroDivisionError):
                    _metadata(delivered)  # type: ignore[arg-type]
        return before, during, found

    before, during, found = run(main())

    assert before == (None, False)
    assert during == (1024 * 1024, False)
    assert found is None
