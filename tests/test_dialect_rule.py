"""The dialect rule: what each database family knows lives in its package under
``inbox/_backends/`` (docs/architecture.md, "Where to change X": a database dialect or
driver). Anywhere else in ``inbox/`` there is no ``dialect.name`` comparison, no dialect
name, no SQLSTATE and no MySQL/MariaDB error number: the code asks the family
(``inbox._backends.family_of``) instead.

The scan reads each module's syntax tree, so a docstring or a comment that names a database
is not a violation; a dialect name in an f-string (an error message) is not either.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parents[1] / "inbox"

# The families' own packages: where the knowledge belongs.
BACKENDS: Final = "_backends/"
ALLOWED: Final = (
    BACKENDS,
    # Alembic revisions are frozen history: each spells its DDL per dialect as it was when
    # it shipped, and must not change with the backends (an old revision re-run later has to
    # do exactly what it did).
    "migrations/",
    # PostgreSQL-only by definition (declarative partitioning): there is no other family to
    # ask, and its SQLSTATEs (a partition dropped concurrently) are its own subject.
    "partitioning/",
)

DIALECT_NAMES: Final = frozenset({"postgresql", "mysql", "mariadb", "sqlite"})
# A SQLSTATE: five characters, a digit first ("40001", "40P01", "42P01", "23505").
SQLSTATE: Final = re.compile(r"[0-9][0-9A-Z]{4}")
# Where a driver keeps its error code: psycopg/asyncpg/pg8000, psycopg2, sqlite3.
ERROR_CODE_ATTRIBUTES: Final = frozenset({"sqlstate", "pgcode", "sqlite_errorcode"})
# The MySQL/MariaDB server and client error numbers the inbox classifies (in the backends):
# duplicate entry, deadlock, lock wait timeout, record changed, no such table, data too long,
# packet too large, can't connect, server gone, lost connection, too many connections...
MYSQL_ERRORS: Final = frozenset(
    {1020, 1040, 1045, 1049, 1053, 1062, 1146, 1153, 1205, 1213, 1301, 1406}
    | {1451, 1452, 2002, 2003, 2006, 2013}
)


def violations_in(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each piece of database knowledge in ``source``."""
    tree = ast.parse(source)
    skipped = _fstring_parts(tree) | _docstrings(tree)
    for node in ast.walk(tree):
        if id(node) not in skipped:
            what = _knowledge(node)
            if what is not None:
                yield getattr(node, "lineno", 0), what


def _knowledge(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        owner = node.value
        owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if node.attr == "name" and owner_name == "dialect":
            return "dialect.name read"
        if node.attr in ERROR_CODE_ATTRIBUTES:
            return f"driver error code .{node.attr}"
        return None
    if not isinstance(node, ast.Constant):
        return None
    value = node.value
    if isinstance(value, str):
        if value in DIALECT_NAMES:
            return f"dialect name {value!r}"
        if value in ERROR_CODE_ATTRIBUTES:
            return f"driver error code {value!r}"
        if SQLSTATE.fullmatch(value):
            return f"SQLSTATE {value!r}"
    elif type(value) is int and value in MYSQL_ERRORS:
        return f"MySQL error number {value}"
    return None


def _fstring_parts(tree: ast.AST) -> set[int]:
    # A dialect named in an error message is not a decision made by it.
    return {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for n in ast.walk(node)
    }


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            first = body[0].value
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(id(first))
    return found


def all_violations() -> list[str]:
    """``path:line: what`` for every violation in the package outside the allowed places."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(ALLOWED):
            continue
        text = path.read_text(encoding="utf-8")
        for line, what in violations_in(text):
            found.append(f"inbox/{relative}:{line}: {what}")
    return found


def test_database_knowledge_stays_in_the_backends() -> None:
    found = all_violations()
    assert not found, (
        f"{len(found)} piece(s) of database knowledge outside inbox/_backends/ "
        "(ask the family: inbox._backends.family_of(bind)):\n" + "\n".join(found)
    )


def test_the_scan_finds_each_kind() -> None:
    source = (
        "if engine.dialect.name == 'postgresql': pass\n"
        "name = connection.dialect.name\n"
        "x = getattr(orig, 'sqlstate', None) == '40P01'\n"
        "y = exc.orig.pgcode\n"
        "z = args[0] in (1213, 1205)\n"
        "t = Text().with_variant(LONGTEXT(), 'mysql')\n"
    )
    kinds = [what for _, what in violations_in(source)]
    assert kinds.count("dialect.name read") == 2
    assert "dialect name 'postgresql'" in kinds
    assert "dialect name 'mysql'" in kinds
    assert "SQLSTATE '40P01'" in kinds
    assert "driver error code 'sqlstate'" in kinds
    assert "driver error code .pgcode" in kinds
    assert {"MySQL error number 1213", "MySQL error number 1205"} <= set(kinds)


def test_messages_and_docstrings_are_not_violations() -> None:
    source = (
        '"""Runs on postgresql and mysql."""\n'
        "def f(dialect):\n"
        '    """Says sqlite."""\n'
        "    raise ValueError(f'{dialect.name}+{dialect.driver} is not supported')\n"
        "size = 1000 * 1024\n"
    )
    assert list(violations_in(source)) == []
