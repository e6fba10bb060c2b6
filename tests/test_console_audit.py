"""``inbox console``'s audit trail (issue 32 item 6): served as an operator starts it, every
sign-in, refusal and action is a line on stderr (``--log-level`` sets what else shows, and
``warning`` silences them there), and with ``--audit-file`` a JSON line in that file; a
request authenticated by HTTP Basic records its user name, also when it is refused."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from console_support import PASSWORD, TOKEN
from support.databases import Database

from inbox.console._audit import audit, log_to
from inbox.console._auth import SESSION_COOKIE

BASIC = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
WRONG_BASIC = "Basic " + base64.b64encode(b"mallory:guess-guess-guess").decode()


@contextmanager
def served(db: Database, *options: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``inbox console`` in a process of its own; its URL and the process (stderr piped)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "INBOX_CONSOLE_TOKEN": TOKEN,
        "INBOX_CONSOLE_PASSWORD": PASSWORD,
        "INBOX_CONSOLE_USER": "alice",
        "INBOX_DATABASE_URL": db.url,
    }
    command = "import sys; from inbox.admin import admin_main; sys.exit(admin_main())"
    process = subprocess.Popen(
        [sys.executable, "-c", command, "console", "--port", str(port), *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/login")
                break
            except httpx.ConnectError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "the console never answered"
                time.sleep(0.1)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


def acts(url: str) -> None:
    """A refused sign-in, a sign-in, a refused action by a wrong Basic user, and one by
    the right Basic user on a read-only console."""
    assert httpx.post(url + "/login", data={"token": "not-the-token-at-all"}).status_code == 401
    signed_in = httpx.post(url + "/login", data={"token": TOKEN})
    assert signed_in.status_code == 303
    assert SESSION_COOKIE in signed_in.cookies
    drop = {"id": "00000000-0000-0000-0000-000000000001", "csrf": "x"}
    refused = httpx.post(url + "/outbox/drop", data=drop, headers={"authorization": WRONG_BASIC})
    assert refused.status_code == 401
    read_only = httpx.post(url + "/outbox/drop", data=drop, headers={"authorization": BASIC})
    assert read_only.status_code == 403


def test_audit_lines_go_to_stderr_and_the_audit_file(pg_db: Database, tmp_path: Path) -> None:
    audit_file = tmp_path / "audit.jsonl"
    with served(pg_db, "--audit-file", str(audit_file)) as (url, process):
        acts(url)
        time.sleep(0.5)  # the lines are written before each response; let stderr drain
    assert process.stderr is not None
    err = process.stderr.read()
    lines = [x for x in err.splitlines() if "inbox.console.audit" in x]
    assert len(lines) == 4, err
    assert "INFO inbox.console.audit: console action by='-' action=login count=0" in lines[0]
    assert "outcome='refused'" in lines[0]
    assert "by='token' action=login count=1" in lines[1]
    assert "by='mallory' action=refused count=0" in lines[2]
    assert "why='wrong credentials'" in lines[2]
    assert "by='alice' action=refused count=0" in lines[3]
    assert "why='read-only'" in lines[3]

    records = [json.loads(x) for x in audit_file.read_text(encoding="utf-8").splitlines()]
    assert [(r["who"], r["action"], r["count"]) for r in records] == [
        ("-", "login", 0),
        ("token", "login", 1),
        ("mallory", "refused", 0),
        ("alice", "refused", 0),
    ]
    assert records[3]["path"] == "/outbox/drop"
    assert records[3]["why"] == "read-only"
    assert all(r["time"].endswith("+00:00") for r in records)
    assert TOKEN not in audit_file.read_text(encoding="utf-8") + err
    assert PASSWORD not in audit_file.read_text(encoding="utf-8") + err


def test_log_level_warning_silences_stderr_but_not_the_audit_file(
    pg_db: Database, tmp_path: Path
) -> None:
    audit_file = tmp_path / "audit.jsonl"
    with served(pg_db, "--log-level", "warning", "--audit-file", str(audit_file)) as (
        url,
        process,
    ):
        acts(url)
        time.sleep(0.5)
    assert process.stderr is not None
    assert "inbox.console.audit" not in process.stderr.read()
    assert len(audit_file.read_text(encoding="utf-8").splitlines()) == 4


def test_an_audit_file_that_cannot_be_opened_is_a_usage_error(
    pg_db: Database, tmp_path: Path
) -> None:
    env = {**os.environ, "INBOX_CONSOLE_TOKEN": TOKEN, "INBOX_DATABASE_URL": pg_db.url}
    command = "import sys; from inbox.admin import admin_main; sys.exit(admin_main())"
    missing = tmp_path / "no" / "such" / "dir" / "audit.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", command, "console", "--audit-file", str(missing)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"cannot open the audit file {missing}: No such file or directory" in result.stderr


def test_log_to_again_replaces_what_it_set_up(tmp_path: Path) -> None:
    first, second = io.StringIO(), io.StringIO()
    audit_file = tmp_path / "audit.jsonl"
    try:
        log_to("info", str(audit_file), stream=first)
        log_to("info", str(audit_file), stream=second)
        audit("alice", "dlq.purge", 2, {"queue": "orders", "dry_run": False})
        logging.getLogger("inbox.console.pages").info("not an audit fact")
    finally:  # leave the logging of the tests after this one as it was
        console = logging.getLogger("inbox.console")
        for handler in list(console.handlers):
            console.removeHandler(handler)
            handler.close()
        console.setLevel(logging.NOTSET)
    assert first.getvalue() == ""
    lines = second.getvalue().splitlines()
    assert len(lines) == 2
    assert "console action by='alice' action=dlq.purge count=2 queue='orders'" in lines[0]
    [record] = [json.loads(x) for x in audit_file.read_text(encoding="utf-8").splitlines()]
    assert {k: v for k, v in record.items() if k != "time"} == {
        "who": "alice",
        "action": "dlq.purge",
        "count": 2,
        "queue": "orders",
        "dry_run": False,
    }
