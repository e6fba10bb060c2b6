"""Keep docs/architecture.md's module tables true to the package.

The tables' rows read ``| `inbox/x/y.py` | 123 | job |``. The tool keeps each row's
hand-written job, sets its line count to today's (``wc -l``), adds a row for every module of
`inbox/` no table lists (its job the first line of its docstring, to be rewritten by hand)
under the table of its package, and removes the rows of modules that no longer exist
(printing them). tests/test_architecture_doc.py fails when the file differs from what this
tool would write.

    python tools/architecture_table.py            # print what would change
    python tools/architecture_table.py --write    # rewrite docs/architecture.md
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
REGENERATE = "python tools/architecture_table.py --write"

_ROW = re.compile(r"^\| `(?P<path>inbox/[^`]+\.py)` \| *(?P<lines>\d*) *\| (?P<job>.*) \|$")


@dataclass
class Rewrite:
    """The doc as the tool would write it, and what it changed."""

    text: str
    counted: list[str]
    added: list[str]
    removed: list[str]


def modules(root: Path = ROOT) -> list[str]:
    """Every `.py` file under `inbox/`, as a path relative to the repository."""
    return sorted(path.relative_to(root).as_posix() for path in (root / "inbox").rglob("*.py"))


def line_count(path: Path) -> int:
    """What ``wc -l`` says: the number of newlines."""
    return path.read_bytes().count(b"\n")


def first_docstring_line(path: Path) -> str:
    """A new row's job: the first line of the module's docstring, or a note to write one."""
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    line = docstring.strip().splitlines()[0] if docstring and docstring.strip() else ""
    return line.replace("|", "\\|") or "(no docstring: describe its job)"


def rewrite(text: str, root: Path = ROOT) -> Rewrite:
    """The doc with its module tables made true to the files under `root`."""
    lines = text.splitlines()
    existing = set(modules(root))
    counted: list[str] = []
    removed: list[str] = []
    listed: set[str] = set()
    out: list[str] = []
    for line in lines:
        match = _ROW.match(line)
        if not match:
            out.append(line)
            continue
        path = match["path"]
        if path not in existing:
            removed.append(path)
            continue
        listed.add(path)
        count = str(line_count(root / path))
        if count != match["lines"]:
            counted.append(path)
        out.append(_row(path, count, match["job"]))
    added = sorted(existing - listed)
    for path in added:
        _insert(out, _row(path, str(line_count(root / path)), first_docstring_line(root / path)))
    return Rewrite("\n".join(out) + "\n", counted, added, removed)


def _row(path: str, count: str, job: str) -> str:
    return f"| `{path}` | {count} | {job} |"


def _insert(out: list[str], row: str) -> None:
    """After the last row of the module's own directory, else of its nearest parent's."""
    match = _ROW.match(row)
    assert match is not None
    directory = PurePosixPath(match["path"]).parent
    for candidate in (directory, *directory.parents):

        def beside(path: str, c: PurePosixPath = candidate) -> bool:
            return PurePosixPath(path).parent == c

        def below(path: str, c: PurePosixPath = candidate) -> bool:
            return c in PurePosixPath(path).parents

        position = _last_row(out, beside)
        if position is None:
            position = _last_row(out, below)
        if position is not None:
            out.insert(position + 1, row)
            return
    raise SystemExit(f"no table to put {row} in")


def _last_row(out: list[str], wanted: Callable[[str], bool]) -> int | None:
    found = None
    for index, line in enumerate(out):
        match = _ROW.match(line)
        if match and wanted(match["path"]):
            found = index
    return found


_NAMED_PATH = re.compile(r"`([A-Za-z0-9_./-]+\.py)(?:::[^`]*)?`")


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The `.py` paths (with a directory) the doc names in backticks that do not exist.

    A path is looked for from the repository's root and from `inbox/` (the prose names
    `core/_inbox.py` for `inbox/core/_inbox.py`).
    """
    missing = []
    for name in sorted(set(_NAMED_PATH.findall(text))):
        if "/" not in name:
            continue
        if not ((root / name).exists() or (root / "inbox" / name).exists()):
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC.name}")
    args = parser.parse_args(argv)
    result = rewrite(DOC.read_text())
    for path in result.counted:
        print(f"line count updated: {path}")
    for path in result.added:
        print(f"row added (write its job by hand): {path}")
    for path in result.removed:
        print(f"row removed (the module is gone): {path}")
    for name in missing_paths(result.text):
        print(f"named but missing: {name}")
    if args.write:
        DOC.write_text(result.text)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
