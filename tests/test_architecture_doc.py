"""docs/architecture.md's module tables are true to the package.

tools/architecture_table.py rewrites the tables (line counts, a row per module, no row of a
module that is gone); this test fails when the doc differs from what the tool would write,
and when the doc names a `.py` path that does not exist.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parent.parent / "tools" / "architecture_table.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture_table_tool", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_module_tables_are_what_the_tool_writes() -> None:
    tool = load_tool()
    written = tool.DOC.read_text()
    result = tool.rewrite(written)
    if result.text != written:
        diff = "".join(
            difflib.unified_diff(
                written.splitlines(keepends=True),
                result.text.splitlines(keepends=True),
                "docs/architecture.md",
                "what the tool writes",
            )
        )
        raise AssertionError(
            f"docs/architecture.md's module tables are stale: run `{tool.REGENERATE}` "
            f"(then write the job of each added row by hand):\n{diff}"
        )


def test_every_module_is_listed_once() -> None:
    tool = load_tool()
    rows = [m["path"] for line in tool.DOC.read_text().splitlines() if (m := tool._ROW.match(line))]
    duplicated = sorted({path for path in rows if rows.count(path) > 1})
    assert not duplicated, f"listed more than once in docs/architecture.md: {duplicated}"


def test_every_path_the_doc_names_exists() -> None:
    tool = load_tool()
    missing = tool.missing_paths(tool.DOC.read_text())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_tool_adds_a_new_module_and_drops_a_gone_one(tmp_path: Path) -> None:
    tool = load_tool()
    package = tmp_path / "inbox" / "pkg"
    package.mkdir(parents=True)
    (tmp_path / "inbox" / "__init__.py").write_text('"""The root."""\n')
    (package / "__init__.py").write_text('"""A package."""\n\nX = 1\n')
    (package / "_new.py").write_text('"""The new module | its job.\n\nMore.\n"""\n')
    doc = (
        "| module | lines | job |\n|---|---:|---|\n"
        "| `inbox/__init__.py` | 9 | root |\n\n"
        "| module | lines | job |\n|---|---:|---|\n"
        "| `inbox/pkg/__init__.py` | 1 | kept job |\n"
        "| `inbox/pkg/_gone.py` | 5 | gone |\n\nProse.\n"
    )
    result = tool.rewrite(doc, tmp_path)
    assert result.removed == ["inbox/pkg/_gone.py"]
    assert result.added == ["inbox/pkg/_new.py"]
    assert result.text == (
        "| module | lines | job |\n|---|---:|---|\n"
        "| `inbox/__init__.py` | 1 | root |\n\n"
        "| module | lines | job |\n|---|---:|---|\n"
        "| `inbox/pkg/__init__.py` | 3 | kept job |\n"
        "| `inbox/pkg/_new.py` | 4 | The new module \\| its job. |\n\nProse.\n"
    )
