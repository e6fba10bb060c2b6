"""The effect ledger's own connections, where its records live in the claim's database.

A handler holds its claim's connection while its effect is recorded. Were the record
written on another connection of the same pool, as many handlers as the pool holds would
each hold one and wait for a second: a wedge, until the pool's timeout failed them all. So
the ledger writes through an engine beside the claim's, with the same URL, connection
settings and pool size (``Pool.recreate()``: the creator with its connect arguments, the
pool's options and listeners) and the claim engine's execution options (a tenant's
``schema_translate_map``), but a pool of its own. Its connections are held for one short
statement at a time and never while waiting for anything else, so a wait for one always
ends. They are opened only as effects are recorded.

Each inbox owns its ledger engines: one root per claim pool, and beside it one engine per
set of execution options, found by the pool and the options' values, never by the claim
engine object (a tenant bind made per message, ``engine.execution_options(...)``, is a new
object each time: kept by it, every message would leave its engines behind). At most
:data:`OPTION_SETS_KEPT` option sets are kept per pool, the oldest let go first. A root goes
with its claim pool (``Engine.dispose()`` replaces the pool; the next effect gets a new
root) and with the inbox.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Mapping
from typing import Any, Final

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import Pool

__all__ = ["OPTION_SETS_KEPT", "LedgerEngines"]

OPTION_SETS_KEPT: Final = 256
"""Ledger engines kept per claim pool, one per set of execution options (tenants)."""


class _Root:
    """The ledger's engine beside one claim pool, and its engines per option set."""

    __slots__ = ("beside", "engine", "pool")

    def __init__(self, pool: weakref.ref[Pool], engine: Engine) -> None:
        self.pool = pool
        self.engine = engine
        self.beside: dict[Hashable, Engine] = {}


# id(claim pool) -> its root; the weak reference to the pool drops the entry when it goes.
_Roots = dict[int, _Root]


class LedgerEngines:
    """The engines one inbox's ledger writes with beside its claim engines."""

    def __init__(self) -> None:
        self._roots: _Roots = {}
        # The claim engine and pool asked for last, weakly, and the engine beside them: the
        # same engine message after message (no per-message bind) is found without a lookup.
        self._last: tuple[weakref.ref[Engine], weakref.ref[Pool], Engine] | None = None
        self._lock = threading.Lock()
        weakref.finalize(self, _let_go_all, self._roots)

    def beside(self, claim_engine: Engine) -> Engine:
        """The ledger's engine beside ``claim_engine`` (a blocking ``Engine``, the sync side
        of an async one too): its settings and execution options, a pool of its own."""
        pool = claim_engine.pool
        last = self._last
        if last is not None and last[0]() is claim_engine and last[1]() is pool:
            return last[2]
        options = claim_engine.get_execution_options()
        key = _options_key(options) if options else ()
        with self._lock:
            root = self._roots.get(id(pool))
            if root is None or root.pool() is not pool:
                root = self._root(claim_engine, pool)
            engine = root.beside.get(key)
            if engine is None:
                engine = root.engine.execution_options(**options) if options else root.engine
                if len(root.beside) >= OPTION_SETS_KEPT:
                    del root.beside[next(iter(root.beside))]
                root.beside[key] = engine
            self._last = (weakref.ref(claim_engine), root.pool, engine)
            return engine

    def _root(self, claim_engine: Engine, pool: Pool) -> _Root:
        pool_copy = pool.recreate()
        if claim_engine.dialect.is_async:
            # Here, not at the top: the blocking inbox loads no asyncio layer.
            from sqlalchemy.ext.asyncio import create_async_engine

            engine = create_async_engine(claim_engine.url, pool=pool_copy).sync_engine
        else:
            engine = create_engine(claim_engine.url, pool=pool_copy)
        root = _Root(weakref.ref(pool, _when_gone(self._roots, id(pool))), engine)
        self._roots[id(pool)] = root
        return root


def _options_key(options: Mapping[str, Any]) -> Hashable:
    """What tells one set of execution options from another, by value: a new but equal
    ``schema_translate_map`` is the same set."""
    return frozenset((name, type(value), _frozen(value)) for name, value in options.items())


def _frozen(value: object) -> Hashable:
    try:
        if isinstance(value, Mapping):
            return frozenset(value.items())
        hash(value)
    except TypeError:
        # Unhashable: known by identity, which the engine made with it keeps alive (and so
        # unused by another object) for as long as the key is kept with that engine.
        return ("id", id(value))
    return value


def _when_gone(roots: _Roots, key: int) -> Any:
    def gone(_: object) -> None:
        found = roots.pop(key, None)
        if found is not None:
            _let_go(found.engine)

    return gone


def _let_go_all(roots: _Roots) -> None:
    for root in list(roots.values()):
        _let_go(root.engine)
    roots.clear()


def _let_go(root: Engine) -> None:
    """Close the ledger engine's idle connections (an async driver's cannot be closed
    from here, outside the event loop's greenlet: those are dropped, and close as they are
    collected)."""
    root.dispose(close=not root.dialect.is_async)
