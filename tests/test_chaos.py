"""The chaos harness, short mode, as CI runs it: 2,500 operations through RabbitMQ and four
worker processes under random faults, on PostgreSQL and on MariaDB. The harness itself
checks the ledger; this test checks that it ran, that faults of every kind were injected,
and that nothing was doubled or lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.rabbit import Rabbit

pytestmark = pytest.mark.slow

HARNESS = Path(__file__).resolve().parent.parent / "tools" / "chaos" / "run.py"


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_short_chaos_run_commits_every_operation_exactly_once(
    database: str, tmp_path: Path, rabbit: Rabbit, request: pytest.FixtureRequest
) -> None:
    # The fixtures make an unreachable server a skip locally and a failure under CI.
    request.getfixturevalue("pg_db" if database == "postgresql" else "mariadb_db")
    report_path = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            "--database",
            database,
            "--ops",
            "2500",
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())["report"]
    assert report["operations"] == 2500
    assert report["doubled"] == []
    assert report["missing"] == []
    assert report["poison_not_dead_lettered"] == []
    assert report["dead_letters"].get("handler-failed", 0) >= report["poison_operations"] > 0
    assert set(report["queues_at_end"].values()) == {0}
    assert report["final_exit_codes"] == [0, 0, 0, 0]
    faults = report["faults_injected"]
    for kind in ("kill_worker", "close_amqp_connections", "terminate_db_sessions"):
        assert faults.get(kind, 0) >= 1, faults
    assert faults["handler_failures_injected"] > 0
    assert report["messages_published"] > report["operations"]
    assert report["from_worker_logs"]["duplicates_skipped"] > 0
    assert "EXACT" in done.stdout


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_short_outbox_chaos_run_gives_every_committed_operation_one_followup_effect(
    database: str, tmp_path: Path, rabbit: Rabbit, request: pytest.FixtureRequest
) -> None:
    """The outbox stage: handlers publish follow-ups through the outbox, relays are killed
    and lose their connections and sessions, and a second inbox commits each follow-up
    once."""
    request.getfixturevalue("pg_db" if database == "postgresql" else "mariadb_db")
    report_path = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable, str(HARNESS), "--database", database, "--outbox", "--ops", "800",
            "--fault-interval", "1.0", "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())["report"]
    assert report["doubled"] == []
    assert report["missing"] == []
    outbox = report["outbox"]
    assert outbox["sound"], outbox
    assert outbox["violations"] == {
        "followup_missing": [],
        "followup_doubled": [],
        "followup_without_commit": [],
    }
    committed = report["operations"] - report["dead_letter_operations"]
    assert outbox["operations_with_followup"] == committed == outbox["followups_committed"]
    assert outbox["outbox_rows_at_end"] == 0
    assert outbox["relay_final_exit_codes"] == [0, 0]
    faults = report["faults_injected"]
    for kind in ("kill_relay", "close_amqp_connections", "terminate_db_sessions"):
        assert faults.get(kind, 0) >= 1, faults
    assert set(report["queues_at_end"].values()) == {0}
    assert "EXACT" in done.stdout
