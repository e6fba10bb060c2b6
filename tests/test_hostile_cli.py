"""Hostile input at the inbox-cleanup command line: numbers out of every range, table names
that are not plain identifiers, and URLs carrying a password. Each is a one-line usage error
(exit 2) before any connection or SQL, and no password is ever echoed. test_cleanup.py holds
the common cases; this file covers what it leaves out.

Tests whose comment starts "Regression:" reproduce library bugs the hostile-input suite found
(at 5467c00); each comment says what used to happen.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.pool import Pool

from inbox.retention.cli import cleanup_main

SECRET = "s3cr3t-pw"
URL_WITH_PASSWORD = f"postgresql+psycopg://app:{SECRET}@127.0.0.1:1/app"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[str]], CliResult]]:
    """Run inbox-cleanup in-process and fail the test if it connected to any database or
    executed any SQL (listeners on every Pool and Engine) or created its SQLite file."""
    monkeypatch.delenv("INBOX_DATABASE_URL", raising=False)
    never = tmp_path / "never.db"
    touched: list[str] = []

    def on_connect(dbapi_connection: object, record: object) -> None:
        touched.append("connect")

    def on_execute(connection: object, cursor: object, statement: str, *args: object) -> None:
        touched.append(statement)

    event.listen(Pool, "connect", on_connect)
    event.listen(Engine, "before_cursor_execute", on_execute)

    def run(argv: list[str]) -> CliResult:
        if not any(arg.startswith("--database-url") or "://" in arg for arg in argv):
            argv = [*argv, "--database-url", f"sqlite:///{never}"]
        out, err = io.StringIO(), io.StringIO()
        code = cleanup_main(argv, stdout=out, stderr=err)
        return CliResult(code, out.getvalue(), err.getvalue())

    try:
        yield run
    finally:
        event.remove(Pool, "connect", on_connect)
        event.remove(Engine, "before_cursor_execute", on_execute)
    assert touched == [], "a usage error must be reported before any SQL"
    assert not never.exists()


def assert_usage_error(result: CliResult, fragment: str) -> None:
    assert result.code == 2
    assert result.out == ""
    assert "Traceback" not in result.err
    errors = [line for line in result.err.splitlines() if line.startswith("inbox-cleanup: error:")]
    assert len(errors) == 1, result.err
    assert fragment in errors[0]


BAD_ARGUMENTS = {
    "days-10**9": (["--days", str(10**9)], "before year 1"),
    "days-timedelta-max": (["--days", "999999999"], "before year 1"),
    "days-800000": (["--days", "800000"], "before year 1"),
    "days-5000-digits": (["--days", "9" * 5000], "whole number"),
    "days-hugely-negative": (["--days", "-" + "9" * 30], "at least 1"),
    "days-equals-negative": (["--days=-5"], "at least 1"),
    "days-minus-zero": (["--days", "-0"], "at least 1"),
    "days-exponent": (["--days", "1e3"], "whole number"),
    "days-hex": (["--days", "0x10"], "whole number"),
    "days-inf": (["--days", "inf"], "whole number"),
    "days-nan": (["--days", "nan"], "whole number"),
    "days-empty": (["--days", ""], "whole number"),
    "days-decimal-comma": (["--days", "1,5"], "whole number"),
    "days-without-value": (["--days"], "expected one argument"),
    "batch-size-10**30": (["--days", "30", "--batch-size", str(10**30)], "between 1 and"),
    "batch-size-negative": (["--days", "30", "--batch-size", "-1"], "between 1 and"),
    "batch-size-float": (["--days", "30", "--batch-size", "2.5"], "whole number"),
}


@pytest.mark.parametrize(("argv", "fragment"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_numbers_are_one_line_usage_errors_before_any_sql(
    cli: Callable[[list[str]], CliResult], argv: list[str], fragment: str
) -> None:
    assert_usage_error(cli(argv), fragment)


BAD_TABLES = {
    "sql-injection": "x; drop table y",
    "schema-injection": "public; drop table y.inbox_message",
    "three-parts": "a.b.c",
    "empty": "",
    "double-quoted": '"inbox_message"',
    "backticks": "`inbox_message`",
    "brackets": "[inbox_message]",
    "single-quote": "inbox'message",
    "comment": "inbox_message--",
    "space": "inbox message",
    "unicode": "inbox_méssage",
    "leading-digit": "1inbox",
    "64-characters": "x" * 64,
    "trailing-dot": "inbox.",
    "double-dot": "a..b",
    "newline": "inbox_message\n",
    "nul": "inbox\x00message",
}


@pytest.mark.parametrize("table", BAD_TABLES.values(), ids=BAD_TABLES.keys())
def test_table_names_that_are_not_plain_identifiers_exit_2_before_any_sql(
    cli: Callable[[list[str]], CliResult], table: str
) -> None:
    result = cli(["--days", "30", "--table", table])
    assert_usage_error(result, "must be a plain identifier")


# Regression: '.inbox_message' was read as "no schema" and ran against inbox_message.
def test_a_table_name_with_an_empty_schema_part_is_refused(
    cli: Callable[[list[str]], CliResult],
) -> None:
    assert_usage_error(cli(["--days", "30", "--table", ".inbox_message"]), "plain identifier")


@pytest.mark.parametrize(
    "argv",
    [
        ["--days", "0", "--database-url", URL_WITH_PASSWORD],
        ["--days", "30", "--batch-size", "0", "--database-url", URL_WITH_PASSWORD],
        ["--days", "30", "--table", "x;y", "--database-url", URL_WITH_PASSWORD],
        ["--database-url", URL_WITH_PASSWORD],
        [f"--database-url={URL_WITH_PASSWORD}", "--days", "x"],
    ],
    ids=["bad-days", "bad-batch-size", "bad-table", "no-days", "equals-form"],
)
def test_usage_errors_never_print_the_password(
    cli: Callable[[list[str]], CliResult], argv: list[str]
) -> None:
    result = cli(argv)
    assert result.code == 2
    assert SECRET not in result.out + result.err


# Regression: argparse's "unrecognized arguments: ..." echoed a URL given without
# --database-url, or under a mistyped flag, whole: password included.
@pytest.mark.parametrize(
    "argv",
    [["--days", "30", URL_WITH_PASSWORD], ["--days", "30", "--db-url", URL_WITH_PASSWORD]],
    ids=["positional-url", "mistyped-flag"],
)
def test_a_misplaced_url_is_not_echoed_with_its_password(
    cli: Callable[[list[str]], CliResult], argv: list[str]
) -> None:
    result = cli(argv)
    assert result.code == 2
    assert SECRET not in result.err


# Regression: a URL without '@host' (postgresql://app:PASSWORD/db) made make_url raise a bare
# ValueError for the "port", printed as it was: "invalid literal for int() with base 10:
# 'PASSWORD'" — the password, and no word of --database-url.
def test_a_url_without_host_is_reported_without_echoing_what_sits_in_the_port(
    cli: Callable[[list[str]], CliResult],
) -> None:
    result = cli(["--days", "30", "--database-url", f"postgresql://app:{SECRET}/app"])
    assert_usage_error(result, "--database-url")
    assert SECRET not in result.err
