"""The ``inbox`` command (inbox/admin/) and the console (inbox/console/) are two front ends on
inbox/operations/: neither imports the other, the operations import neither, and the command
reaches ``inbox console`` through the ``inbox.subcommands`` entry point. Needs no database or
broker."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import inbox
from inbox.admin._subcommands import ENTRY_POINT_GROUP, Subcommand, discovered

PACKAGE = Path(inbox.__file__).parent
WEB_STACK = ("starlette", "jinja2", "uvicorn")


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Every module each file under ``inbox/<folder>`` imports (at any depth, lazy ones too)."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[path.relative_to(PACKAGE).as_posix()] = names
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("admin", ("inbox.console",)),
        ("console", ("inbox.admin",)),
        ("operations", ("inbox.admin", "inbox.console")),
    ],
)
def test_the_front_ends_import_each_other_in_neither_direction(
    folder: str, forbidden: tuple[str, ...]
) -> None:
    crossing = {
        path: sorted(n for n in names if n.startswith(forbidden))
        for path, names in imported_modules(folder).items()
        if any(n.startswith(forbidden) for n in names)
    }
    assert crossing == {}


def test_the_console_is_registered_as_a_subcommand_of_the_command() -> None:
    (entry,) = [e for e in entry_points(group=ENTRY_POINT_GROUP) if e.name == "console"]
    assert entry.value == "inbox.console._command:SUBCOMMAND"
    console = discovered()["console"]
    assert isinstance(console, Subcommand)
    assert console.help == "the operator console in a browser (docs/console.md)"


def test_inbox_help_lists_the_console_and_loads_no_web_stack() -> None:
    code = (
        "import sys\n"
        "from inbox.admin import admin_main\n"
        "try:\n"
        "    admin_main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('loaded:', sorted(m for m in {WEB_STACK!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    out, err = done.stdout, done.stderr
    assert "console             the operator console in a browser (docs/console.md)" in out, err
    assert out.splitlines()[-1] == "loaded: []", out + err


def test_inbox_console_without_the_console_extra_says_so_in_one_line(tmp_path: Path) -> None:
    # The web stack made unimportable, as it is without the extra installed.
    code = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({WEB_STACK!r}))\n"
        "from inbox.admin import admin_main\n"
        "sys.exit(admin_main())\n"
    )
    env = {"INBOX_CONSOLE_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"}
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    done = subprocess.run(
        [sys.executable, "-c", code, "console", "--database-url", url],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "inbox: error: inbox console needs the console extra: "
        "pip install 'sqlalchemy-inbox[console]'\n"
    )
    assert done.stdout == ""
