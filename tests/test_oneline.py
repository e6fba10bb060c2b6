"""Errors described on one bounded line: real database errors from every backend lose their
SQL and the bound values they echo; other errors keep their first line."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from support.databases import Database

from inbox._oneline import bounded, describe_error
from inbox.delivery import headers as h

CUSTOMER = "Zelda Quaxington, 12 Elm Street"


def database_error(db: Database, statement: str, params: object) -> DBAPIError:
    with db.engine.connect() as connection, pytest.raises(DBAPIError) as raised:
        connection.execute(text(statement), params)
    return raised.value


def test_a_database_error_keeps_its_class_and_the_drivers_first_line_only(db: Database) -> None:
    error = database_error(
        db,
        "INSERT INTO effects (id, ref, handler) VALUES (:customer, 'r', 'h')",
        {"customer": CUSTOMER},
    )
    assert CUSTOMER in str(error)  # SQLAlchemy's own rendering shows it

    line = describe_error(error)

    assert line.startswith(f"{type(error).__name__}: ")
    assert "\n" not in line
    assert "Zelda" not in line
    assert "INSERT" not in line
    assert "[parameters" not in line


def test_values_echoed_by_the_driver_are_masked_also_in_an_executemany(db: Database) -> None:
    rows = [{"id": 1}, {"id": CUSTOMER}]  # PostgreSQL and MariaDB quote the refused value
    error = database_error(
        db, "INSERT INTO effects (id, ref, handler) VALUES (:id, 'r', 'h')", rows
    )

    line = describe_error(error)

    assert "Zelda" not in line
    assert "\n" not in line
    if db.backend != "sqlite":
        assert "***" in line


def test_other_errors_keep_their_first_line() -> None:
    error = ValueError("card declined\nfor customer Zelda\nat step 3")

    assert describe_error(error) == "ValueError: card declined"
    assert describe_error(KeyError()) == "KeyError"


def test_bounded_is_one_line_and_marks_the_cut() -> None:
    assert bounded("a\r\nb\nc\u2028d") == "a | b | c | d"
    assert bounded("x" * 20, 10) == "x" * 9 + "…"
    assert h.truncate("y" * 2000).endswith("…")
    assert len(h.truncate("y" * 2000)) == 1000
    assert describe_error(RuntimeError("z" * 5000)) == "RuntimeError: " + "z" * 485 + "…"
