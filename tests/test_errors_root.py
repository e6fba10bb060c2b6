"""Every error the library raises on purpose is an InboxError (issue 23): an application can
catch the library's failures with one ``except``, and a bad argument is a ConfigurationError
(still a TypeError and a ValueError, as the builtins raised before were)."""

from __future__ import annotations

import ast
import builtins
import inspect
import pkgutil
from pathlib import Path

import pytest

import inbox
from inbox import errors

LIBRARY = Path(inbox.__file__).parent
BUILTIN = frozenset(
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type)
    and issubclass(getattr(builtins, name), BaseException)
)

# The raises of a builtin exception the library keeps, each with its reason. A new one fails
# the scan below until it is an InboxError or listed here with a reason of its own.
ALLOWED_RAISES: dict[tuple[str, str], str] = {
    ("_amqp/confirms.py", "TimeoutError"): "caught by the edge, which reconnects",
    ("broker/_forwarder.py", "TimeoutError"): "caught by the worker, which reconnects",
    ("broker/_forwarder.py", "RuntimeError"): "an invariant of the forwarder: a bug if seen",
    ("_backends/postgresql/_psycopg.py", "AssertionError"): "an invariant of the pipeline",
    ("delivery/_policy.py", "TypeError"): "an invariant: a stop signal is never decided on",
    ("_cli/signals.py", "KeyboardInterrupt"): "SIGTERM stops a command as Ctrl-C does",
    ("outbox/_row.py", "KeyError"): "a mapping without a column: what a lookup raises",
    ("outbox/relay/_relay.py", "TimeoutError"): "run_until_empty(timeout=): the builtin",
    ("testing/__init__.py", "AttributeError"): "a module __getattr__ must raise it",
    ("console/__init__.py", "AttributeError"): "a module __getattr__ must raise it",
    ("testing/_databases.py", "RuntimeError"): "pytest reports a fixture's setup error",
    ("testing/fakes.py", "TimeoutError"): "the fake provider stands in for a timing-out API",
    ("_deprecated.py", "AttributeError"): "a module __getattr__ must raise it",
    ("celery/_tasks.py", "SystemExit"): "Celery ignores what a worker_init receiver raises",
    ("core/effects/_steps.py", "NotImplementedError"): "the store check each shell overrides",
    ("delivery/_plan.py", "TypeError"): "an invariant: a transport answers a copy with a result",
}
# Exception classes that stand in for something outside the library, so must not be ours.
NOT_OURS = {
    "FakeProviderError": "the error an outside provider raises, played by the fake",
    "InjectedFailure": "a handler's own failure, injected by a test",
    "SimulatedCrash": "a process dying (SystemExit), injected by a test",
}


def _raises_of_builtins(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in BUILTIN:
                found.append((node.lineno, target.id))
    return found


def test_the_library_raises_no_builtin_exception_it_has_not_given_a_reason_for() -> None:
    unexplained = [
        f"{relative}:{line} raise {name}"
        for path in sorted(LIBRARY.rglob("*.py"))
        for relative in [path.relative_to(LIBRARY).as_posix()]
        for line, name in _raises_of_builtins(path)
        if (relative, name) not in ALLOWED_RAISES
    ]
    assert unexplained == []


def test_the_scan_sees_a_bare_builtin_raise(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(x):\n    if x:\n        raise ValueError('no')\n    raise KeyError\n")
    assert sorted(_raises_of_builtins(sample)) == [(3, "ValueError"), (4, "KeyError")]


def _exception_classes() -> list[type[BaseException]]:
    seen: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(inbox.__path__, "inbox."):
        if module_info.name.startswith(("inbox.faststream", "inbox.migrations.env")):
            continue  # an optional extra; alembic's environment script (runs only under alembic)
        module = __import__(module_info.name, fromlist=["_"])
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("inbox")
                and not name.startswith("_")
            ):
                seen[f"{value.__module__}.{value.__qualname__}"] = value
    return list(seen.values())


def test_every_exception_class_of_the_library_is_an_inbox_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 20  # the walk found the library's classes, not nothing
    assert errors.CopyRefused in classes
    strays = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if not issubclass(cls, errors.InboxError)
        and cls.__name__ not in NOT_OURS
        # a private module's internal signal (caught where it is raised) is not checked
        and not any(part.startswith("_") for part in cls.__module__.split("."))
    ]
    assert strays == []


@pytest.mark.parametrize("builtin", [TypeError, ValueError])
def test_a_bad_argument_is_a_configuration_error_and_still_the_builtin(
    builtin: type[Exception],
) -> None:
    with pytest.raises(inbox.ConfigurationError) as raised:
        inbox.Outbox(table=42)  # type: ignore[arg-type]
    assert isinstance(raised.value, builtin)
    assert isinstance(raised.value, inbox.InboxError)
    assert "table" in str(raised.value)


def test_a_broken_registration_and_an_unsupported_dialect_are_configuration_errors() -> None:
    assert issubclass(errors.RegistrationError, errors.ConfigurationError)
    assert issubclass(errors.SessionConfigurationError, errors.ConfigurationError)
    assert issubclass(errors.UnsupportedDialect, errors.ConfigurationError)
    assert issubclass(errors.UndecodableBody, errors.InvalidMessage)


def test_every_error_the_package_exports_is_reachable_from_its_root() -> None:
    exported = [getattr(inbox, name) for name in inbox.__all__]
    classes = [value for value in exported if inspect.isclass(value)]
    for cls in classes:
        if issubclass(cls, BaseException):
            assert issubclass(cls, inbox.InboxError), cls
    assert {"ConfigurationError", "CopyRefused", "UndecodableBody"} <= set(inbox.__all__)
