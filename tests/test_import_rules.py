"""The package's import rules: no other package's private modules, no cycle.

Every module of `inbox/` is read with `ast` (nothing is imported):

- a module may import a private module (a path with a `_`-prefixed part) only from inside
  the package that owns it: `inbox.core._inbox` is the core's, so `inbox.core.*` may import
  it and nothing outside `inbox/core/` may; `inbox._oneline` is the root package's, so every
  module may. The exceptions are the ALLOWED list below, each with its reason.
- the module-level imports (those under `if TYPE_CHECKING:` left out: they never run) form
  no cycle.
- an import inside a function that would close a cycle were it at module level (an
  "upward" import: the imported module already reaches the importer) is listed in
  UPWARD_IN_FUNCTIONS with its reason, or fails.

The kombu / py-amqp / SQLAlchemy split is held by tests/test_broker_units.py
(`test_the_core_imports_no_kombu_and_the_broker_edge_no_sqlalchemy`, its BRIDGES); this file
does not repeat it. When a failure lists lines to paste, paste them only with a reason: the
better fix is a public name in the owning package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "inbox"

# (importer, imported): the importer is a module, `package.*` (its modules) or `*`; the
# imported is a private module or a package (its private modules). Each says why it may.
ALLOWED: dict[tuple[str, str], str] = {
    ("inbox", "inbox.core"): "the root re-exports the core's handler types and EffectMode",
    ("inbox.middleware", "inbox.core"): "the public face of the core's middleware chain and run",
    ("inbox.aio.*", "inbox.core"): "the async inbox is the core's decisions driven with awaits",
    ("inbox.aio.*", "inbox.telemetry._core"): "handler outcomes and the claim's time recorded",
    ("inbox.core.*", "inbox.telemetry._core"): "handler outcomes and the claim's time recorded",
    ("*", "inbox.core._startup"): "the start check and MIGRATE_HINT, shared by every process",
    ("*", "inbox.core._retry"): "the one retry loop for transient database errors",
    ("inbox.broker.*", "inbox.delivery"): "the kombu edge carries out delivery's decisions",
    (
        "inbox.operations._archive",
        "inbox.outbox._row",
    ): "the archive stores headers in the outbox's tagged JSON (bytes, times kept as they were)",
    (
        "inbox.faststream.*",
        "inbox.delivery",
    ): "the FastStream edge carries out delivery's decisions",
    (
        "inbox._amqp.frames",
        "inbox.delivery._inbound",
    ): "undecodable properties, as delivery reads them",
    ("inbox.broker.*", "inbox.telemetry"): "the worker's spans, counters and /metrics endpoint",
    (
        "inbox.broker._health_cli",
        "inbox.core._readiness",
    ): "/readyz asks the core's database question",
    ("inbox.broker.*", "inbox.outbox.relay._relay"): "inbox-worker --relay runs a Relay beside it",
    ("inbox.broker.publisher", "inbox.outbox._arguments"): "Publisher and Outbox refuse the same",
    (
        "inbox.outbox._outbox",
        "inbox.core._run",
    ): "a message sent from a handler names the message it runs on (causation headers)",
    (
        "inbox.outbox._arguments",
        "inbox.core._bodies",
    ): "typed bodies published as the core parses them",
    ("inbox.outbox._session", "inbox._backends._autocommit"): "autocommit read per driver",
    ("inbox.retention.*", "inbox.partitioning"): "retention drops expired partitions",
    ("inbox.testing.*", "inbox.core._registration"): "failing_after swaps a handler; the session",
    ("inbox.testing._scenarios", "inbox.core._handlers"): "failing_after wraps a RegisteredHandler",
    ("inbox.testing.harness", "inbox.broker._idle"): "the harness runs a real worker until idle",
    ("inbox.admin.*", "inbox.operations"): "the inbox command is a front end on the operations",
    ("inbox.console.*", "inbox.operations"): "the console is a front end on the operations",
    ("inbox.operations._filters", "inbox.delivery._policy"): "DeadLetterReason for --reason",
    ("inbox.operations._status", "inbox.partitioning._catalog"): "inbox status lists partitions",
    ("inbox.operations._tables", "inbox.retention._targets"): "--schema / --all-schemas tables",
    ("inbox.celery.*", "inbox.delivery"): "the Celery edge carries out delivery's decisions",
    (
        "inbox.celery._task",
        "inbox.core._handlers",
    ): "a task's claim key computed as the core computes its handler's",
}

# (importer, imported module) imported inside a function although the imported module (or its
# package) reaches the importer (or its package) at module level.
UPWARD_IN_FUNCTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("inbox"):
                yield alias.name
        return
    base = _resolve(importer, node)
    if not base.startswith("inbox"):
        return
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in MODULES else base


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(importer: str, nodes: list[ast.stmt], in_function: bool) -> Iterator[Import]:
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _targets(importer, node):
                yield Import(importer, target, node.lineno, in_function)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            continue
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(importer, node.body, True)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    statements = [c for c in children if isinstance(c, ast.stmt)]
                    statements += [
                        s for c in children if isinstance(c, ast.ExceptHandler) for s in c.body
                    ]
                    yield from _walk(importer, statements, in_function)


def imports() -> list[Import]:
    found: list[Import] = []
    for name, path in MODULES.items():
        found.extend(_walk(name, ast.parse(path.read_text(), str(path)).body, False))
    return found


def owner_of_private(module: str) -> str | None:
    """The package a private module belongs to (`inbox` or one of its packages), or None.

    `inbox.core.effects._ledger` is the core's: the core's subpackages are the core.
    """
    parts = module.split(".")
    if not any(part.startswith("_") for part in parts):
        return None
    return "inbox" if parts[1].startswith("_") else ".".join(parts[:2])


def package_of(module: str) -> str:
    """The node of the package graph: `inbox.x` for a module of package x, else the module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and is_package(".".join(parts[:2])) else module


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _matches(importer: str, pattern: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return _within(importer, pattern[:-2])
    return importer == pattern


def _allowed(entries: dict[tuple[str, str], str], importer: str, imported: str) -> bool:
    return any(_matches(importer, a) and _within(imported, b) for a, b in entries)


def test_no_module_imports_another_packages_private_module() -> None:
    violations = sorted(
        {
            (found.importer, found.imported)
            for found in imports()
            if (owner := owner_of_private(found.imported)) is not None
            and not _within(found.importer, owner)
            and not _allowed(ALLOWED, found.importer, found.imported)
        }
    )
    assert not violations, (
        f"{len(violations)} import(s) of another package's private module. Give the owning "
        "package a public name for it, or add to ALLOWED in tests/test_import_rules.py, "
        "with the reason:\n" + "\n".join(f'    ({a!r}, {b!r}): "why",' for a, b in violations)
    )


def test_the_allow_lists_name_imports_that_exist() -> None:
    found = {(i.importer, i.imported) for i in imports()}
    stale = [
        entry
        for entry in [*ALLOWED, *UPWARD_IN_FUNCTIONS]
        if not any(_matches(a, entry[0]) and _within(b, entry[1]) for a, b in found)
    ]
    assert not stale, f"allow-list entries no module needs any more (remove them): {stale}"


def _graph(edges: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for edge in edges:
        if edge.imported in MODULES and edge.imported != edge.importer:
            graph[edge.importer].add(edge.imported)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        for successor in graph[node] - seen:
            seen.add(successor)
            todo.append(successor)
    return False


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for importer, imported in graph.items():
        packages[package_of(importer)] |= {package_of(i) for i in imported} - {package_of(importer)}
    return packages


def test_the_module_level_imports_form_no_cycle_of_modules_or_of_packages() -> None:
    graph = _graph([i for i in imports() if not i.in_function])
    cycles = _cycles(graph) + _cycles(_package_graph(graph))
    assert not cycles, "import cycles among module-level imports:\n" + "\n".join(
        "    " + " <-> ".join(cycle) for cycle in cycles
    )


def _runs_back_up(found: Import, graph: dict[str, set[str]], packages: dict[str, set[str]]) -> bool:
    """Whether the imported module, or its package, already reaches the importer's."""
    if found.imported not in MODULES or found.imported == found.importer:
        return False
    if _reaches(graph, found.imported, found.importer):
        return True
    importer, imported = package_of(found.importer), package_of(found.imported)
    return importer != imported and _reaches(packages, imported, importer)


def test_imports_inside_functions_that_run_back_up_are_named() -> None:
    everything = imports()
    graph = _graph([i for i in everything if not i.in_function])
    packages = _package_graph(graph)
    upward = sorted(
        {
            (i.importer, i.imported)
            for i in everything
            if i.in_function
            and _runs_back_up(i, graph, packages)
            and not _allowed(UPWARD_IN_FUNCTIONS, i.importer, i.imported)
        }
    )
    assert not upward, (
        f"{len(upward)} import(s) inside a function of a module that already reaches the "
        "importer (a cycle hidden in a function). Turn it around, or add to "
        "UPWARD_IN_FUNCTIONS in tests/test_import_rules.py, with the reason:\n"
        + "\n".join(f'    ({a!r}, {b!r}): "why",' for a, b in upward)
    )
