"""Retention: the cleanup function on every backend, and the inbox-cleanup CLI's contract."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, insert, select
from support.databases import POSTGRES_URL, Database

from inbox import cleanup
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_message, metadata

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def seed(db: Database, ages: dict[str, dt.timedelta]) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [
                {"message_id": uuid.uuid4(), "handler": name, "processed_at": NOW - age}
                for name, age in ages.items()
            ],
        )


def remaining(db: Database) -> set[str]:
    with db.engine.connect() as connection:
        return set(connection.execute(select(inbox_message.c.handler)).scalars())


def test_deletes_exactly_the_claims_strictly_older_than_the_window(db: Database) -> None:
    day = dt.timedelta(days=1)
    tick = dt.timedelta(microseconds=1)
    seed(
        db,
        {
            "older-by-a-day": 31 * day,
            "older-by-a-microsecond": 30 * day + tick,
            "exactly-at-the-boundary": 30 * day,
            "younger-by-a-microsecond": 30 * day - tick,
            "fresh": dt.timedelta(0),
        },
    )

    report = cleanup(db.engine, days=30, now=NOW)

    assert report.deleted == 2
    assert report.cutoff == NOW - 30 * day
    assert remaining(db) == {"exactly-at-the-boundary", "younger-by-a-microsecond", "fresh"}


def test_deletes_in_bounded_batches(db: Database) -> None:
    seed(db, {f"old-{i}": dt.timedelta(days=40 + i) for i in range(7)} | {"new": dt.timedelta(0)})

    report = cleanup(db.engine, days=30, batch_size=3, now=NOW)

    assert (report.deleted, report.batches) == (7, 3)
    assert remaining(db) == {"new"}


def test_reports_its_longest_batch(db: Database) -> None:
    seed(db, {f"old-{i}": dt.timedelta(days=40 + i) for i in range(5)})

    report = cleanup(db.engine, days=30, batch_size=2, now=NOW)

    assert report.batches == 3
    assert 0 < report.longest_batch_seconds <= report.seconds
    assert cleanup(db.engine, days=30, dry_run=True, now=NOW).longest_batch_seconds == 0.0


def test_dry_run_counts_and_deletes_nothing(db: Database) -> None:
    seed(db, {"old": dt.timedelta(days=90), "new": dt.timedelta(days=1)})

    report = cleanup(db.engine, days=30, dry_run=True, now=NOW)

    assert (report.deleted, report.batches, report.dry_run) == (1, 0, True)
    assert remaining(db) == {"old", "new"}


def test_cleanup_accepts_a_url_and_a_custom_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'custom.db'}"
    engine = create_engine(url)
    from sqlalchemy import MetaData

    from inbox.schema import inbox_table

    custom = inbox_table(MetaData(), "consumer_inbox")
    custom.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            insert(custom),
            {"message_id": uuid.uuid4(), "handler": "h", "processed_at": NOW - dt.timedelta(9)},
        )
    engine.dispose()

    assert cleanup(url, days=1, table="consumer_inbox", now=NOW).deleted == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"days": 0}, ValueError, "at least 1"),
        ({"days": -3}, ValueError, "at least 1"),
        ({"days": 1.5}, TypeError, "whole number"),
        ({"days": True}, TypeError, "whole number"),
        ({"days": 10**9}, ValueError, "before year 1"),
        ({"days": 30, "batch_size": 0}, ValueError, "batch_size"),
        ({"days": 30, "table": "x y"}, ValueError, "plain identifier"),
    ],
)
def test_bad_arguments_are_rejected_before_touching_the_database(
    kwargs: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        cleanup("sqlite://", **kwargs)  # type: ignore[arg-type]


def run_cli(*argv: str, env_url: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.pop("INBOX_DATABASE_URL", None)
    if env_url is not None:
        os.environ["INBOX_DATABASE_URL"] = env_url
    try:
        code = cleanup_main(list(argv), stdout=out, stderr=err)
    finally:
        os.environ.pop("INBOX_DATABASE_URL", None)
        if saved is not None:
            os.environ["INBOX_DATABASE_URL"] = saved
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    engine = create_engine(url)
    metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_message),
            [
                {"message_id": uuid.uuid4(), "handler": "old", "processed_at": NOW.replace(2020)},
                {
                    "message_id": uuid.uuid4(),
                    "handler": "new",
                    "processed_at": dt.datetime.now(dt.UTC),
                },
            ],
        )
    engine.dispose()
    return url


def test_cli_deletes_and_prints_one_summary_line(sqlite_url: str) -> None:
    code, out, err = run_cli("--days", "30", "--database-url", sqlite_url)
    assert (code, err) == (0, "")
    [line] = out.splitlines()
    assert "deleted 1 claims" in line
    assert re.search(r"in 1 batches \(longest \d+ ms\), \d+\.\d\d s$", line), line


def test_cli_reads_the_url_from_the_environment_and_can_be_quiet(sqlite_url: str) -> None:
    assert run_cli("--days", "30", "--quiet", env_url=sqlite_url) == (0, "", "")


def test_cli_dry_run_says_what_it_would_delete(sqlite_url: str) -> None:
    code, out, _ = run_cli("--days", "30", "--dry-run", "--database-url", sqlite_url)
    assert code == 0
    assert "would delete 1 claims" in out
    again = run_cli("--days", "30", "--dry-run", "--database-url", sqlite_url)[1]
    assert again.rsplit(",", 1)[0] == out.rsplit(",", 1)[0]  # the same, but for the timing


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--days", "-1"], "at least 1"),
        (["--days", "0"], "at least 1"),
        (["--days", "1.5"], "whole number"),
        (["--days", "abc"], "whole number"),
        (["--days", "99999999999"], "before year 1"),
        ([], "--days"),
        (["--days", "30", "--bogus"], "unrecognized arguments"),
        (["--days", "30", "--batch-size", "0"], "between 1 and"),
        (["--days", "30", "--table", "inbox;drop"], "plain identifier"),
        (["--days", "30", "--database-url", "::not a url::"], "not a valid"),
    ],
)
def test_cli_bad_arguments_exit_2_with_a_message(
    sqlite_url: str, argv: list[str], fragment: str
) -> None:
    if "--database-url" not in argv:
        argv = [*argv, "--database-url", sqlite_url]
    code, out, err = run_cli(*argv)
    assert code == 2
    assert out == ""
    assert fragment in err
    assert "Traceback" not in err


def test_cli_without_any_database_url_exits_2() -> None:
    code, _, err = run_cli("--days", "30")
    assert code == 2
    assert "INBOX_DATABASE_URL" in err


def test_cli_unreachable_database_exits_1_without_showing_the_password() -> None:
    url = "postgresql+psycopg://app:s3cr3t-pw@127.0.0.1:1/app?connect_timeout=2"
    code, out, err = run_cli("--days", "30", "--database-url", url)
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "s3cr3t-pw" not in err
    assert "***" in err


@pytest.mark.parametrize(
    "url",
    [
        # trust auth ignores the password; the database named like it makes the server's
        # error message repeat it, so the masking of the message itself is exercised.
        POSTGRES_URL.replace("postgres@", "postgres:hunter2pw@").rsplit("/", 1)[0] + "/hunter2pw",
        POSTGRES_URL.rsplit("/", 1)[0] + "/hunter2pw?password=hunter2pw",
    ],
    ids=["in-userinfo", "in-query"],
)
def test_cli_masks_the_password_even_where_the_server_repeats_it(url: str) -> None:
    code, out, err = run_cli("--days", "30", "--database-url", url)
    assert code == 1
    assert out == ""
    assert "hunter2pw" not in err
    assert "***" in err
    assert len(err.strip().splitlines()) == 1


# Regression (issue 15, bug 6): with an unescaped '@' in the password, the URL parser ended
# the password at that '@' and took its tail for the host, so the error read "failed to
# resolve host 'tPassw0rd@127.0.0.1'", twice.
def test_cli_refuses_a_password_with_an_unescaped_at_without_printing_any_of_it() -> None:
    url = "postgresql+psycopg://app:s3cr@tPassw0rd@127.0.0.1:1/app?connect_timeout=2"
    code, out, err = run_cli("--days", "30", "--database-url", url)
    assert code == 2
    assert out == ""
    assert "s3cr" not in err
    assert "tPassw0rd" not in err
    assert "percent-encode '@' as %40" in err
    escaped = url.replace("s3cr@tPassw0rd", "s3cr%40tPassw0rd")
    code, _, err = run_cli("--days", "30", "--database-url", escaped)
    assert code == 1, err  # the escaped form is a valid URL: the server is just not there
    assert "tPassw0rd" not in err


# Letters that no message of the CLI puts side by side, and the characters a URL parser
# treats specially.
_SECRET_LETTERS = "BFGJKMWXZ"
_PASSWORDS = st.text(alphabet=_SECRET_LETTERS + "@:/?#%!$&=+;,[]", min_size=1, max_size=24)


def secret_fragments(password: str) -> set[str]:
    """Every run of two or more letters of ``password``: what a parser could cut out of it."""
    return set(re.findall(f"[{_SECRET_LETTERS}]{{2,}}", password))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(password=_PASSWORDS)
def test_cli_never_prints_a_fragment_of_an_unescaped_password(password: str) -> None:
    url = f"postgresql+psycopg://app:{password}@127.0.0.1:1/app?connect_timeout=2"
    runs = [run_cli("--days", "30", *argv) for argv in (["--database-url", url], [url])]
    runs += [run_cli("--days", "30", "--db-url", url), run_cli("--days", "30", env_url=url)]
    for code, out, err in runs:
        assert code in (1, 2)
        fragments = secret_fragments(password)
        # The password whole too, once it has letters (':' alone shows up anyway).
        for fragment in fragments | ({password} if fragments else set()):
            assert fragment not in out + err, (password, err)


def test_cli_reports_a_missing_driver_in_one_line() -> None:
    code, _, err = run_cli("--days", "30", "--database-url", "mssql+pymssql://u:pw@host/db")
    assert code == 1
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert ":pw@" not in err


def test_cli_missing_table_exits_1(tmp_path: Path) -> None:
    code, _, err = run_cli("--days", "30", "--database-url", f"sqlite:///{tmp_path / 'e.db'}")
    assert code == 1
    assert "inbox_message" in err


def test_installed_console_script_runs(sqlite_url: str) -> None:
    script = shutil.which("inbox-cleanup", path=str(Path(sys.executable).parent))
    assert script is not None, "the inbox-cleanup console script is not installed"
    done = subprocess.run(
        [script, "--days", "30", "--database-url", sqlite_url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "deleted 1 claims" in done.stdout
    bad = subprocess.run([script, "--days", "x"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2
