"""The public API is what tests/public_api.txt says it is.

tools/public_api.py writes every public module's `__all__` with each name's kind and
signature; this test writes it again in memory and compares. A difference is a change to the
public API: make it on purpose, name it in CHANGELOG.md (Unreleased), and regenerate the file
with the command the failure prints.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "public_api.py"

# Public modules that may lack __all__ for now: inbox.delivery is being reshaped (issue 30,
# item 2, a Transport protocol); its public modules get __all__ with that work.
WITHOUT_ALL_FOR_NOW: set[str] = set()


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("public_api_tool", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_public_api_is_the_snapshot() -> None:
    tool = load_tool()
    today = tool.snapshot()
    recorded = tool.SNAPSHOT.read_text() if tool.SNAPSHOT.exists() else ""
    if today != recorded:
        diff = "".join(
            difflib.unified_diff(
                recorded.splitlines(keepends=True),
                today.splitlines(keepends=True),
                "tests/public_api.txt (recorded)",
                "the code today",
            )
        )
        raise AssertionError(
            "the public API changed. If on purpose, name the change in CHANGELOG.md "
            f"(Unreleased) and run `{tool.REGENERATE}`:\n{diff}"
        )


def test_the_snapshot_lists_every_public_module_and_each_declares_all() -> None:
    tool = load_tool()
    modules = tool.public_modules()
    assert {"inbox", "inbox.broker", "inbox.aio", "inbox.testing"} <= set(modules)
    assert not any(name.startswith("inbox.migrations.versions") for name in modules)
    undeclared = [
        name
        for name in modules
        if not hasattr(importlib.import_module(name), "__all__") and name not in WITHOUT_ALL_FOR_NOW
    ]
    assert not undeclared, f"public modules without __all__: {undeclared}"


DEPRECATED = {
    "inbox": ["HandlerFunc", "KeyFunc", "RegisteredHandler"],
    "inbox.aio": ["AsyncHandlerFunc"],
    "inbox.outbox": ["row_values", "headers_to_json", "resolve_outbox_table"],
    "inbox.partitioning": [
        "DEFAULT_DAYS_AHEAD",
        "DEFAULT_HOLD_SECONDS",
        "DEFAULT_LOCK_TIMEOUT",
        "MAX_TABLE_NAME_LENGTH",
        "KEYS_BOUND",
    ],
    "inbox.retention": ["MAX_CLEANUP_BATCH_SIZE", "cutoff_for"],
    "inbox.testing": ["DATABASE_URL_ENV", "throwaway_database"],
}


def test_a_name_that_left_the_public_api_still_works_for_a_release_with_a_warning() -> None:
    for module_name, names in DEPRECATED.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert name not in module.__all__
            with pytest.warns(DeprecationWarning, match=rf"{module_name}\.{name} is deprecated"):
                value = getattr(module, name)
            assert value is not None
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        importlib.import_module("inbox.partitioning").Nonexistent  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        importlib.import_module("inbox.testing").Nonexistent  # noqa: B018


def test_the_changelog_names_every_deprecated_name() -> None:
    changelog = (TOOL.parent.parent / "CHANGELOG.md").read_text()
    unreleased = changelog.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    unnamed = [
        f"{module}.{name}"
        for module, names in DEPRECATED.items()
        for name in names
        if f"{module}.{name}" not in unreleased
    ]
    assert not unnamed, f"CHANGELOG.md (Unreleased) does not name: {unnamed}"
