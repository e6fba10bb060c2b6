"""A griffe extension for the documentation site (mkdocs.yml, mkdocstrings' ``extensions``):
the docstrings' Sphinx roles (``:class:`~sqlalchemy.orm.Session```, ``:meth:`process```)
become mkdocstrings cross-references, and ``docs/NAME.md`` mentions become links to the page.

The docstrings keep their Sphinx spelling (they read the same in an editor, ``help()`` and
on the site). A role is resolved in the scope of the object whose docstring holds it, as
Python would resolve the name there, else among the names ``inbox`` exports. The reference
is *optional* for mkdocs-autorefs: a target the site documents becomes a link; any other
(a private module, SQLAlchemy, the standard library: no inventory is fetched, the build
stays offline) is shown as code with its full path as the tooltip, never as the raw role.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

# :class:`Name`, :meth:`~pkg.Cls.method`, :py:func:`f` ... (not :param x: / :raises X:).
ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<target>[^`<>]+)`")
# docs/effects.md, optionally followed by the section it points at: ("Cleanup").
PAGE = re.compile(r"``(?P<quoted>docs/[a-z_]+\.md)``|(?<![\w/`])(?P<bare>docs/[a-z_]+\.md)")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles and page mentions of every docstring once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Walk the package (its own objects, not aliases) and rewrite each docstring."""
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj, pkg)


def rewrite(text: str, scope: griffe.Object, package: griffe.Module) -> str:
    """``text`` with its roles as cross-references and its docs/ mentions as links."""
    text = ROLE.sub(lambda m: _reference(m.group("target"), scope, package), text)
    return PAGE.sub(_page_link, text)


def _reference(target: str, scope: griffe.Object, package: griffe.Module) -> str:
    short = target.startswith("~")
    name = target.lstrip("~").removesuffix("()")
    title = name.lstrip(".").rsplit(".", 1)[-1] if short else name.lstrip(".")
    identifier = _resolve(name, scope, package)
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )


def _resolve(name: str, scope: griffe.Object, package: griffe.Module) -> str:
    if name.startswith("."):  # relative to the module: ~.sqlite._backend.SQLiteBackend
        return f"{scope.module.path}{name}"
    head, _, rest = name.partition(".")
    if rest and head == package.name:  # absolute: inbox.celery.InboxTask
        return name
    try:
        resolved = scope.resolve(head)
    except griffe.NameResolutionError:
        resolved = package.members[head].path if head in package.members else head
    else:
        if resolved == head and head in package.members:
            resolved = package.members[head].path
    return f"{resolved}.{rest}" if rest else resolved


def _page_link(match: re.Match[str]) -> str:
    path = match.group("quoted") or match.group("bare")
    page = path.removeprefix("docs/").removesuffix(".md")
    return f"[`{path}`]({page}.md)"  # relative to docs/reference.md, the API page


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias and isinstance(member, griffe.Object):
            found.extend(_objects(member))
    return found
