"""``inbox console``'s audit trail (issue 32 item 6): served as an operator starts it, every
sign-in, refusal and action is a line on stderr (``--log-level`` sets what else shows, and
``warning`` silences them there), and with ``--audit-file`` a JSON line in that file; a
request authenticated by HTTP Basic records its user name, also when it is refused."""

from __future__ import annotations

import base64
import getpass
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
import pytest
from console_support import PASSWORD, TOKEN, dead_letter, declare_queues
from support.databases import Database
from support.rabbit import Rabbit

from inbox.admin import admin_main
from inbox.console._audit import audit, log_to
from inbox.console._auth import SESSION_COOKIE
from inbox.operations._audit_trail import AUDIT_FILE_ENV, append_record, read_newest

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


def test_the_audit_page_reads_the_file_back_across_a_restart_with_the_commands_lines(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit_file = tmp_path / "audit.jsonl"
    queue = rabbit.queue("cli-audited")
    declare_queues(rabbit, queue)
    message_id = dead_letter(rabbit, queue)
    with served(pg_db, "--audit-file", str(audit_file)) as (url, _):
        assert httpx.post(url + "/login", data={"token": TOKEN}).status_code == 303

    # The command, given the file by the environment, appends its replay to the same file.
    monkeypatch.setenv(AUDIT_FILE_ENV, str(audit_file))
    out, err = io.StringIO(), io.StringIO()
    on = ["--broker", rabbit.url, "--queue", queue]
    assert admin_main(["dlq", "replay", *on, "--dry-run"], stdout=out, stderr=err) == 0
    assert admin_main(["dlq", "replay", *on], stdout=out, stderr=err) == 0, err.getvalue()
    assert "replayed 1 of 1" in out.getvalue()
    monkeypatch.delenv(AUDIT_FILE_ENV)

    with served(pg_db, "--audit-file", str(audit_file)) as (url, _):  # a new process
        page = httpx.get(url + "/audit", headers={"authorization": BASIC})
        assert page.status_code == 200
        rows = page.text.split('<tr class="audit-row">')[1:]
        assert len(rows) == 2  # the dry run changed nothing and wrote no line
        replayed, signed_in = rows  # newest first
        assert f'<td class="audit-who">{getpass.getuser()}</td>' in replayed
        assert '<td class="audit-action">dlq.replay</td>' in replayed
        assert f"queue={queue}" in replayed
        assert "via=inbox" in replayed
        assert "ids=any" in replayed
        assert message_id not in signed_in
        assert '<td class="audit-who">token</td>' in signed_in
        assert '<td class="audit-action">login</td>' in signed_in
        assert "From the audit file" in page.text
        only = httpx.get(
            url + "/audit", params={"action": "dlq.replay"}, headers={"authorization": BASIC}
        )
        assert only.text.count('<tr class="audit-row">') == 1


def test_the_audit_file_is_read_from_its_end_and_lines_not_audit_records_are_left_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    for n in range(50):
        append_record(str(path), "bob", "dlq.replay", n, {"queue": f"q{n}"})
    with path.open("a", encoding="utf-8") as file:
        file.write('not json\n[1, 2]\n{"time": "never", "who": "x", "action": "y"}\n')
        file.write('{"time": "2026-01-01T00:00:00+00:00", "who": "cut-by-a-cra')  # no newline
    newest = read_newest(str(path), 5)
    assert [r.count for r in newest] == [49, 48, 47, 46, 45]
    assert newest[0].details == {"queue": "q49"}
    assert newest[0].at.tzinfo is not None
    window = len((path.read_bytes().split(b"\n"))[-6]) * 4  # the end of the file only
    tail = read_newest(str(path), 1000, max_bytes=window)
    assert 0 < len(tail) < 50
    assert [r.count for r in tail] == list(range(49, 49 - len(tail), -1))
    assert read_newest(str(tmp_path / "missing.jsonl"), 5) == []


def test_an_audit_file_the_command_cannot_open_stops_it_before_any_change(
    tmp_path: Path,
) -> None:
    err = io.StringIO()
    missing = str(tmp_path / "no-such-dir" / "audit.jsonl")
    argv = ["dlq", "replay", "--broker", "amqp://127.0.0.1:1//", "--queue", "q"]
    assert admin_main([*argv, "--audit-file", missing], stdout=io.StringIO(), stderr=err) == 2
    assert f"cannot open the audit file {missing}" in err.getvalue()
