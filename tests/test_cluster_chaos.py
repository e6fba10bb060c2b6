"""The chaos harness on clusters, short mode, as CI runs it: a three-node RabbitMQ cluster
(quorum queues) and a PostgreSQL primary with a synchronous standby, both started by the
harness; the queue's leader crashed and stopped, the primary crashed and its standby promoted,
on top of the usual worker kills, connection closes and session terminations. Nothing may be
doubled or lost. (Soaks and the asynchronous measurement: docs/cluster.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.databases import cannot_run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tools" / "chaos" / "run.py"


def test_chaos_on_a_rabbitmq_cluster_and_a_failing_over_postgresql(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tools.cluster._process import ClusterError
    from tools.cluster.postgres import pg_bin
    from tools.cluster.rabbit import RABBIT_BIN

    try:
        postgres_bin = pg_bin()
    except ClusterError as exc:
        cannot_run(str(exc))
    needed = [RABBIT_BIN / "rabbitmq-server", postgres_bin / "pg_basebackup", postgres_bin / "psql"]
    if missing := [str(path) for path in needed if not path.exists()]:
        cannot_run(f"cluster tools not installed: {missing}")
    report_path = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable, str(HARNESS), "--cluster", "both", "--ops", "1200",
            "--workers", "3", "--cluster-fault-interval", "2", "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(report_path.read_text())["report"]
    assert report["cluster"]["errors"] == []
    assert report["cluster"]["replication"] == "sync"
    assert report["doubled"] == []
    assert report["missing"] == []
    assert report["exact"] is True
    assert set(report["queues_at_end"].values()) == {0}
    faults = report["faults_injected"]
    # The first two cluster faults: the primary's crash, then the queue leader's.
    assert faults.get("rabbit_kill_leader", 0) >= 1, faults
    assert faults.get("pg_failover", 0) >= 1, faults
    assert report["cluster"]["pg_promotions"] == faults["pg_failover"]
    assert report["from_worker_logs"]["broker_reconnects"] > 0
    assert report["from_worker_logs"]["duplicates_skipped"] > 0
    assert "EXACT" in done.stdout
