"""Testing applications built on the inbox: a pytest plugin and the helpers behind it.

The plugin (``inbox.testing.plugin``, loaded by pytest through the ``pytest11`` entry point)
provides the ``inbox_*`` fixtures; this package holds what tests call directly:
:func:`assert_idempotent`, :class:`FakeProvider` for ``inbox.effect``, :class:`WorkerHarness`
(the worker on kombu's in-memory broker), and :func:`failing_after` to make a handler fail
once it ran. See docs/testing.md.

Names are imported when first used, so loading the plugin costs nothing more than
``import inbox``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names

if TYPE_CHECKING:
    from inbox.testing._databases import ThrowawayDatabase
    from inbox.testing._scenarios import InjectedFailure, SimulatedCrash, failing_after
    from inbox.testing.asserts import NotIdempotent, assert_idempotent, assert_idempotent_async
    from inbox.testing.fakes import FakeProvider, FakeProviderError
    from inbox.testing.harness import DeadLetterCopy, WorkerHarness

__all__ = [
    "DeadLetterCopy",
    "FakeProvider",
    "FakeProviderError",
    "InjectedFailure",
    "NotIdempotent",
    "SimulatedCrash",
    "ThrowawayDatabase",
    "WorkerHarness",
    "assert_idempotent",
    "assert_idempotent_async",
    "failing_after",
]

_HOMES = {
    "ThrowawayDatabase": "inbox.testing._databases",
    "NotIdempotent": "inbox.testing.asserts",
    "assert_idempotent": "inbox.testing.asserts",
    "assert_idempotent_async": "inbox.testing.asserts",
    "FakeProvider": "inbox.testing.fakes",
    "FakeProviderError": "inbox.testing.fakes",
    "DeadLetterCopy": "inbox.testing.harness",
    "WorkerHarness": "inbox.testing.harness",
    "InjectedFailure": "inbox.testing._scenarios",
    "SimulatedCrash": "inbox.testing._scenarios",
    "failing_after": "inbox.testing._scenarios",
}


_FIXTURES = "use the inbox_database fixture (or --inbox-database-url)"
_deprecated = deprecated_names(
    __name__,
    {
        "DATABASE_URL_ENV": ("inbox.testing._databases", _FIXTURES),
        "throwaway_database": ("inbox.testing._databases", _FIXTURES),
    },
)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        return _deprecated(name)
    return getattr(importlib.import_module(home), name)
