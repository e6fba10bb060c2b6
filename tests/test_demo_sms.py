"""The SMS demo (issue 12's timeline with a worker): every SMS once, every delivery row once,
through failures after sending, redeliveries, re-sends and two crashed processes."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "demo_sms.py"
run_demo = runpy.run_path(str(EXAMPLE))["run_demo"]


def test_demo_sms_command_reports_every_sms_once() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inbox.demo_sms", "--requests", "20"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EXACTLY ONCE: every SMS sent once, every delivery row once" in done.stdout


def test_the_ledger_accounts_for_the_crashes_and_the_retries(tmp_path: Path) -> None:
    ledger = run_demo(tmp_path, requests=25, seed=3)
    assert ledger.exact, ledger
    assert ledger.crashed_processes == 2
    # The process that died inside the call left its effect started: the retry called again
    # with the same key (the provider sent nothing new). The one that died after the done
    # record got the stored receipt: no second request.
    assert ledger.repeated_with_same_key == 1
    assert ledger.provider_requests == 26
    assert ledger.sms_sent == ledger.delivery_rows == 25
    assert ledger.failures_retried >= 5  # requests 5, 10, ... fail once after sending
    assert ledger.deliveries > 25


def test_a_mismatch_is_reported(tmp_path: Path) -> None:
    ledger = run_demo(tmp_path, requests=5, seed=1)
    ledger.delivery_rows += 1
    assert not ledger.exact
