"""NATS for the suite: a JetStream server of a test module's own (``tools/cluster``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.databases import cannot_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.cluster.jetstream import NATS_SERVER, NatsCluster


@contextmanager
def jetstream_url(**options: Any) -> Iterator[str]:
    """One JetStream server started with ``options`` (NatsCluster's: ``first_port``,
    ``max_payload``, ...), its client URL; a missing nats-server skips locally, fails in CI."""
    if not Path(NATS_SERVER).exists():
        cannot_run(f"nats-server not installed ({NATS_SERVER})")
    with NatsCluster(1, **options) as server:
        yield server.urls()[0]
