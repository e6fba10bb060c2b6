"""The short run of benchmarks/celery_soak.py: a few hundred inbox tasks per transport
(RabbitMQ, Redis) under a real prefork Celery worker whose pool children are SIGKILLed
(mid-task, and right after a commit before the ack) while tasks are sent twice: every
task's row is written exactly once, none is lost, none is dead-lettered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.databases import POSTGRES_URL
from support.rabbit import AMQP_URL
from support.redis import REDIS_URL

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "celery_soak.py"


def test_a_short_soak_doubles_and_loses_nothing_on_both_transports(tmp_path: Path) -> None:
    report = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            *("--tasks", "900", "--kill-every", "0.5", "--self-kill-one-in", "50"),
            *("--duplicate-one-in", "10", "--settle", "45", "--json", str(report)),
            *("--database", POSTGRES_URL, "--rabbitmq", AMQP_URL),
            *("--redis", REDIS_URL.rsplit("/", 1)[0] + "/6"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(report.read_text())["results"]
    assert [r["transport"] for r in results] == ["rabbitmq", "redis"]
    for result in results:
        assert (result["doubled"], result["lost"], result["dead_letters"]) == (0, 0, 0), result
        assert result["children_killed"] >= 3, "the faults happened"
        assert result["self_kills_after_commit"] >= 1, result
        assert result["messages_sent"] > result["tasks"]
