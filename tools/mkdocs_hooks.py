"""mkdocs hooks for the documentation site (mkdocs.yml): pages made from files outside docs/
(README.md, CHANGELOG.md, RELEASING.md, benchmarks/README.md and its plots), the command-line
reference generated from the argparse parsers, and the checks that make
``mkdocs build --strict`` fail on a public name without a docstring or a page showing a raw
Sphinx role. The home page is README.md without its paragraph on running the test suite."""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.plugins.inbox")  # under "mkdocs": strict mode counts it

ROOT = Path(__file__).resolve().parent.parent

# Site page -> the repository file it is made from.
PAGES = {
    "index.md": "README.md",
    "changelog.md": "CHANGELOG.md",
    "releasing.md": "RELEASING.md",
    "benchmarks.md": "benchmarks/README.md",
}
# Links written for the repository, as the site spells them.
_LINKS = [
    (re.compile(r"\]\((?:\.\./)?docs/"), "]("),
    (re.compile(r"\]\((?:\.\./)?benchmarks/README\.md"), "](benchmarks.md"),
    (re.compile(r"\]\((?:\.\./)?CHANGELOG\.md"), "](changelog.md"),
    (re.compile(r"\]\((?:\.\./)?RELEASING\.md"), "](releasing.md"),
]
# A link to a repository file that is no site page (examples/, tools/...): shown as its path.
_REPOSITORY_LINK = re.compile(
    r"\[([^\]]+)\]\((?:\.\./)?((?:examples|tools|tests|inbox|monitoring)/[^)]*)\)"
)

# README's paragraph on running the repository's tests (from its lead-in to the end of the
# test-command block): for contributors, not for the site's home page.
_TEST_SUITE = re.compile(
    r"^Set up and run the tests.*?<!-- /test-command -->\n+", re.DOTALL | re.MULTILINE
)

# A Sphinx role left in a built page (tools/griffe_roles.py turns the docstrings' into links):
# :class:`Session` as Markdown renders it, :class:<code>Session</code>.
RAW_ROLE = re.compile(r":(?:py:)?[a-z]+:<code>")

_PARSER_MARK = re.compile(r"<!-- argparse: (?P<command>[\w -]+) -->")

# The public modules the API reference documents (docs/reference.md): each name in their
# __all__ must have a docstring.
DOCUMENTED = (
    "inbox",
    "inbox.aio",
    "inbox.middleware",
    "inbox.faststream",
    "inbox.testing",
    "inbox.schema",
    "inbox.broker",
    "inbox.telemetry",
    "inbox.partitioning",
    "inbox.retention",
    "inbox.migrations",
)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the pages made from repository files, and the newest benchmark plots."""
    for page, source in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        if page == "index.md":
            text, cut = _TEST_SUITE.subn("", text, count=1)
            if not cut:
                log.warning("README.md: the test-suite paragraph to leave off the home page moved")
        if page == "benchmarks.md":
            text += _plots(files, config)
        files.append(File.generated(config, page, content=_site_links(text)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Repository links as the site spells them; ``<!-- argparse: COMMAND -->`` replaced by
    that command's ``--help``."""
    return _PARSER_MARK.sub(lambda m: _help(m.group("command")), _site_links(markdown))


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Fail (in strict mode) on a page that shows a raw Sphinx role."""
    for match in RAW_ROLE.finditer(output):
        context = output[match.start() : match.start() + 60].split("</", 1)[0]
        log.warning("%s shows a raw Sphinx role: %s", page.file.src_uri, context)
    return output


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Fail (in strict mode) when a documented public name has no docstring. Read by griffe
    from the source, as mkdocstrings reads it: nothing is imported."""
    import griffe

    package = griffe.load("inbox", search_paths=[str(ROOT)], resolve_aliases=True)
    for name in DOCUMENTED:
        module = package if name == "inbox" else package[name.removeprefix("inbox.")]
        if module.docstring is None:
            log.warning("module %s has no docstring", name)
        for exported in sorted(module.exports or ()):
            member = module.members.get(str(exported))
            if member is None:
                log.warning("%s.__all__ names %s, which it does not define", name, exported)
                continue
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue  # defined outside the package
            if target.is_attribute:
                continue  # constants and type aliases: documented where they are defined
            if target.docstring is None:
                log.warning("%s.%s has no docstring", name, exported)
    return config


def _site_links(text: str) -> str:
    for pattern, replacement in _LINKS:
        text = pattern.sub(replacement, text)
    return _REPOSITORY_LINK.sub(r"\1 (`\2`)", text)


def _plots(files: Files, config: MkDocsConfig) -> str:
    """The PNG plots of the newest run in benchmarks/results/ (not in git: present where
    the benchmarks ran), as a section of the page; nothing when there are none."""
    runs = sorted((ROOT / "benchmarks" / "results").glob("*/"), key=lambda p: p.name)
    plots = sorted(runs[-1].glob("*.png")) if runs else []
    if not plots:
        return ""
    lines = ["", "## Plots", "", f"From `benchmarks/results/{runs[-1].name}/`.", ""]
    for plot in plots:
        target = f"benchmarks/{plot.name}"
        files.append(File.generated(config, target, abs_src_path=str(plot)))
        lines += [f"![{plot.stem}]({target})", ""]
    return "\n".join(lines)


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from inbox.admin._parser import command_parsers
    from inbox.broker.cli import _worker_parser
    from inbox.outbox.relay.cli import _relay_parser
    from inbox.retention.cli import _cleanup_parser

    parsers: dict[str, argparse.ArgumentParser] = {
        "inbox-worker": _worker_parser(),
        "inbox-relay": _relay_parser(),
        "inbox-cleanup": _cleanup_parser(),
    }
    parsers.update(command_parsers())
    return parsers


def _help(command: str) -> str:
    parsers = _parsers()
    if command not in parsers:
        log.warning("docs: no parser for %r (known: %s)", command, ", ".join(parsers))
        return ""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same width everywhere
    return f"```text\n{parsers[command].format_help().rstrip()}\n```"
