"""No SQL in the library is built by string formatting: table and schema names reach SQL as
Table objects (after the identifier checks test_hostile_cli.py exercises), values as bound
parameters. An AST checker over the library's source, and a test that the checker catches what
it must."""

from __future__ import annotations

import ast
from pathlib import Path

import inbox as inbox_package

RAW_SQL_CALLS = {"text", "literal_column", "exec_driver_sql", "DDL", "TextClause"}
EXECUTING_CALLS = {"execute", "exec_driver_sql", "executemany", "executescript"}


def is_built_string(node: ast.expr) -> bool:
    """An f-string, a %- or +-formatted string, a .format() or .join() call."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return any(
            (isinstance(side, ast.Constant) and isinstance(side.value, str))
            or is_built_string(side)
            for side in (node.left, node.right)
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "join")
    )


def is_compiled_construct(node: ast.expr) -> bool:
    """``str(<construct>.compile(...))``: SQL that SQLAlchemy rendered from a statement."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "str"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Call)
        and isinstance(node.args[0].func, ast.Attribute)
        and node.args[0].func.attr == "compile"
    )


def raw_sql_findings(source: str) -> tuple[list[str], list[str]]:
    """(every raw-SQL call with its first argument, the ones whose SQL text is computed).

    A name bound to ``str(<construct>.compile(...))`` counts as safe SQL: SQLAlchemy
    rendered it from a statement, with bound parameters, and no string was formatted.
    """
    found: list[str] = []
    bad: list[str] = []
    tree = ast.parse(source)
    rendered = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_compiled_construct(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        if name in RAW_SQL_CALLS:
            found.append(f"{name}({ast.unparse(first) if first else ''})")
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            compiled = isinstance(first, ast.Name) and first.id in rendered
            if not literal and not compiled:
                bad.append(f"line {node.lineno}: {name}() of a computed string")
        if name in EXECUTING_CALLS and first is not None and is_built_string(first):
            bad.append(f"line {node.lineno}: {name}() of a formatted string")
    return found, bad


def test_the_checker_catches_formatted_sql() -> None:
    for snippet in [
        'text(f"DELETE FROM {table}")',
        'text("DELETE FROM %s" % table)',
        'text("DELETE FROM {}".format(table))',
        'literal_column("x" + name)',
        'connection.exec_driver_sql(f"SELECT {x}")',
        'connection.execute("SELECT " + x)',
        "text(sql)",
        "sql = str(name)\nconnection.exec_driver_sql(sql)",
        "sql = str(query).format(x)\nconnection.exec_driver_sql(sql)",
    ]:
        assert raw_sql_findings(snippet)[1], snippet
    assert raw_sql_findings('text("SELECT 1"); connection.execute(select(t))')[1] == []
    rendered = "sql = str(insert(t).compile(dialect=d))\nconnection.exec_driver_sql(sql, params)"
    assert raw_sql_findings(rendered)[1] == []


def test_no_sql_in_the_library_is_built_by_string_formatting() -> None:
    library = Path(inbox_package.__file__).parent
    found: dict[str, list[str]] = {}
    for path in sorted(library.rglob("*.py")):
        calls, bad = raw_sql_findings(path.read_text(encoding="utf-8"))
        assert bad == [], f"{path.relative_to(library)}: {bad}"
        if calls:
            found[path.relative_to(library).as_posix()] = calls
    # The library's only raw SQL: constant statements (catalog queries with bound parameters,
    # pseudo-column names, UNLOCK TABLES, MySQL's max_allowed_packet, the outbox's NOTIFY
    # trigger with the table name filled in by SQLAlchemy), and the constants of the marker
    # the PostgreSQL claim sets. Table and schema names reach SQL as sqlalchemy Table objects
    # (quoted by the dialect) after resolve_table() has refused anything but plain
    # identifiers; values are always bound parameters.
    # Each call by its first 56 characters: enough to tell them apart.
    assert {path: [call[:56] for call in calls] for path, calls in found.items()} == {
        "_backends/postgresql/_claims.py": [
            # the marker the PostgreSQL claim sets: constants
            "literal_column(\"'on'\")",
            "literal_column(\"'default_transaction_read_only'\")",
            "literal_column(\"'on'\")",
            "literal_column('true')",
        ],
        "_backends/postgresql/_family.py": [
            "text('SELECT coalesce(sum(pg_total_relation_size(c.oid))",
            # the schema a search path finds a table in: a constant, the name bound
            "text('SELECT n.nspname FROM pg_catalog.pg_class c JOIN p",
            'text("SELECT DISTINCT n.nspname FROM pg_catalog.pg_class',
        ],
        "_backends/mysql/_backend.py": [
            "exec_driver_sql('UNLOCK TABLES')",
        ],
        "_backends/mysql/_family.py": [
            "text('SELECT coalesce(sum(data_length + index_length), 0",
            'text("SELECT DISTINCT table_schema FROM information_sche',
            "text('SET TRANSACTION ISOLATION LEVEL READ COMMITTED')",
            "DDL('ALTER TABLE %(fullname)s AUTO_INCREMENT = 1')",
            "exec_driver_sql('SELECT @@max_allowed_packet')",  # a constant
        ],
        "_backends/sqlite/_family.py": [
            "literal_column('rowid')",
            "text(\"SELECT count(*) FROM sqlite_master WHERE name = 's",
            "text('DELETE FROM sqlite_sequence WHERE name = :name')",
        ],
        "retention/_pg_walk.py": [
            "literal_column('ctid')",
        ],
        "_outbox_notify.py": [
            'DDL("CREATE OR REPLACE FUNCTION %(schema)s.inbox_outbox_',
            "DDL('CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON ",
            'DDL("CREATE OR REPLACE FUNCTION inbox_outbox_notify() RE',
            "DDL('CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON ",
        ],
    }
