"""The chaos harness's effect stage, short: 400 operations through RabbitMQ and four worker
processes under every fault of the harness plus SIGKILLs inside the effect's call. In
at-most-once mode no operation's provider was ever called twice and every uncertain-effect
dead letter is accounted for; in at-least-once mode a repeated call carries the same key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.databases import Database
from support.rabbit import Rabbit

pytestmark = pytest.mark.slow

HARNESS = Path(__file__).resolve().parent.parent / "tools" / "chaos" / "run.py"


@pytest.mark.parametrize("mode", ["at-most-once", "at-least-once"])
def test_effect_stage_never_calls_twice_without_the_same_key(
    mode: str, tmp_path: Path, rabbit: Rabbit, pg_db: Database
) -> None:
    report_path = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable, str(HARNESS), "--ops", "400", "--effects", mode,
            "--kill-in-call", "0.02", "--json", str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())["report"]
    effects = report["effects"]
    assert effects["sound"], effects
    assert not any(effects["violations"].values())
    assert report["doubled"] == []
    assert report["missing"] == []
    assert report["faults_injected"]["self_kill_in_call"] >= 1
    assert effects["operations_called"] == 400
    uncertain = report["dead_letters"].get("uncertain-effect", 0)
    if mode == "at-most-once":
        assert effects["provider_calls"] == 400  # every operation called exactly once
        assert effects["uncertain_effect_dead_letters"] >= 1
    else:
        assert uncertain == 0
        repeated = effects["operations_called_again_same_key"]
        assert effects["provider_calls"] >= 400 + repeated
