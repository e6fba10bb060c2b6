"""The documentation site as a reader gets it: ``mkdocs build --strict`` (mkdocs.yml, the
hooks of tools/mkdocs_hooks.py and tools/griffe_roles.py) into a temporary directory, then the
built HTML read. About ten seconds: one build for the module. The metrics table of
docs/operations.md is checked against the instrument names the inbox records under.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inbox.telemetry import _names

ROOT = Path(__file__).resolve().parent.parent
RAW_ROLE = re.compile(r":(?:py:)?[a-z]+:<code>")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    built = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_api_page_shows_no_raw_sphinx_role(site: Path) -> None:
    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert RAW_ROLE.findall(page) == []


def test_roles_naming_documented_objects_are_links(site: Path) -> None:
    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    # :class:`~inbox.UncertainEffect`, :meth:`process` inside Inbox, :class:`~inbox.aio.AsyncInbox`
    for target in ("inbox.UncertainEffect", "inbox.Inbox.process", "inbox.aio.AsyncInbox"):
        assert re.search(rf'<a class="autorefs autorefs-internal"[^>]*href="#{target}"', page), (
            target
        )
    # No inventory is fetched (offline build): SQLAlchemy's names are code, with their path.
    assert '<span title="sqlalchemy.orm.Session"><code>Session</code></span>' in page


def test_docs_mentions_in_docstrings_are_links(site: Path) -> None:
    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert '<a href="../effects/"><code>docs/effects.md</code></a>' in page
    assert re.findall(r"(?<![>/\w])docs/\w+\.md", page) == []


def test_the_home_page_leaves_the_test_suite_to_the_development_page(site: Path) -> None:
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Run the demo" in home
    assert "run the tests" not in home
    assert "pytest" not in home


def test_the_metrics_table_names_the_instruments_the_inbox_records() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("## Metrics and traces", 1)[1].split("\n## ", 1)[0]
    documented = {
        name
        for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE)
        for name in re.findall(r"`([a-z_.]+)`", row)
    }
    recorded = {
        value
        for key, value in vars(_names).items()
        if key.isupper() and isinstance(value, str) and "." in value and key != "SCOPE"
    }
    assert documented - recorded == set()
    assert "inbox.effects" in documented


def test_the_guide_migrates_as_the_readme_does() -> None:
    step = re.compile(r"^1\. \*\*Migrate\*\*: `([^`]+)`", re.MULTILINE)
    readme = step.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    guide = step.findall((ROOT / "docs" / "guide.md").read_text(encoding="utf-8"))
    assert readme == guide
    assert readme[0].startswith("inbox migrate ")
