"""The short run of tools/chaos/celery_chaos.py, one transport per test: inbox tasks under two
real prefork Celery workers while pool children and main processes are SIGKILLed (from outside,
after a commit before the ack, inside an effect's call), the workers' broker connections are
cut, tasks are sent twice, two beats send every slot, and (Redis) slow tasks outlive the
visibility timeout or (RabbitMQ) the outbox relay dies between publish and delete. Every task
is written once or dead-lettered as an uncertain effect; and every fault really happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.databases import POSTGRES_URL
from support.rabbit import AMQP_URL
from support.redis import REDIS_URL

CHAOS = Path(__file__).resolve().parent.parent / "tools" / "chaos" / "celery_chaos.py"


@pytest.mark.parametrize("transport", ["rabbitmq", "redis"])
def test_a_short_celery_chaos_run_doubles_and_loses_nothing(transport: str, tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable,
            str(CHAOS),
            *("--transports", transport, "--tasks", "150", "--outbox-tasks", "40"),
            *("--beat-seconds", "12", "--settle", "45", "--json", str(report)),
            *("--database", POSTGRES_URL, "--rabbitmq", AMQP_URL),
            *("--redis", REDIS_URL.rsplit("/", 1)[0] + "/5"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=400,
    )
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    [result] = json.loads(report.read_text())["results"]
    summary = {k: v for k, v in result.items() if k != "effects"}
    # The ledger: nothing doubled or lost, a dead letter only for an uncertain effect.
    assert (result["doubled"], result["lost"], result["unfinished_at_end"]) == ([], [], 0), summary
    assert result["dead_letters_not_uncertain"] == [], summary
    assert (result["beat_slots_doubled"], result["beat_slots_lost"]) == ([], []), summary
    assert result["effects"]["sound"], result["effects"]
    assert (
        result["committed"] + result["effects"]["uncertain_effect_dead_letters"]
        == (result["tasks"])
    ), summary
    # The faults happened.
    fired = {
        "pool children killed": result["children_killed"],
        "main processes killed": result["mains_killed"] + result["mains_killed_after_commit"],
        "children killed after commit": result["children_killed_after_commit"],
        "children killed in an effect's call": result["killed_in_call"],
        "uncertain effects dead-lettered": result["effects"]["uncertain_effect_dead_letters"],
        "broker connections cut": result["connections_cut"],
        "tasks sent twice": result["messages_sent"] - (result["tasks"] - result["outbox_tasks"]),
        "beat slots sent twice": result["beat_slots_sent_twice_or_more"],
    }
    if transport == "redis":
        fired["slow task redelivered while it ran"] = result["slow_redelivered_while_running"]
    else:
        fired["relay killed between publish and delete"] = result["relay_crashes"]
        fired["rows sent again after the crashes"] = result["relay_published_after_crashes"]
    assert all(count >= 1 for count in fired.values()), (fired, summary)
    assert done.returncode == 0, done.stdout[-3000:]
