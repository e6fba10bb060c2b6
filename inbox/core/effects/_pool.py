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

Each inbox owns its ledger engines, one per claim pool. One goes with its claim pool
(``Engine.dispose()`` replaces the pool; the next effect gets a new ledger engine) and with
the inbox.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import Pool

__all__ = ["LedgerEngines"]

# id(claim pool) -> (a reference to it that lets go of the ledger engine when it goes,
# the ledger engine beside it)
_Roots = dict[int, tuple["weakref.ref[Pool]", Engine]]


class LedgerEngines:
    """The engines one inbox's ledger writes with beside its claim engines."""

    def __init__(self) -> None:
        self._roots: _Roots = {}
        # id(claim engine) -> (it, its pool then, the ledger engine with its options)
        self._engines: dict[int, tuple[Engine, weakref.ref[Pool], Engine]] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _let_go_all, self._roots)

    def beside(self, claim_engine: Engine) -> Engine:
        """The ledger's engine beside ``claim_engine`` (a blocking ``Engine``, the sync side
        of an async one too): its settings and execution options, a pool of its own."""
        pool = claim_engine.pool
        with self._lock:
            made = self._engines.get(id(claim_engine))
            if made is not None and made[1]() is pool:
                return made[2]
            root = self._root(claim_engine, pool)
            options = claim_engine.get_execution_options()
            engine = root.execution_options(**options) if options else root
            self._engines[id(claim_engine)] = (claim_engine, weakref.ref(pool), engine)
            return engine

    def _root(self, claim_engine: Engine, pool: Pool) -> Engine:
        found = self._roots.get(id(pool))
        if found is not None and found[0]() is pool:
            return found[1]
        pool_copy = pool.recreate()
        if claim_engine.dialect.is_async:
            # Here, not at the top: the blocking inbox loads no asyncio layer.
            from sqlalchemy.ext.asyncio import create_async_engine

            root = create_async_engine(claim_engine.url, pool=pool_copy).sync_engine
        else:
            root = create_engine(claim_engine.url, pool=pool_copy)
        self._roots[id(pool)] = (weakref.ref(pool, _when_gone(self._roots, id(pool))), root)
        return root


def _when_gone(roots: _Roots, key: int) -> Any:
    def gone(_: object) -> None:
        found = roots.pop(key, None)
        if found is not None:
            _let_go(found[1])

    return gone


def _let_go_all(roots: _Roots) -> None:
    for _, root in list(roots.values()):
        _let_go(root)
    roots.clear()


def _let_go(root: Engine) -> None:
    """Close the ledger engine's idle connections (an async driver's cannot be closed
    from here, outside the event loop's greenlet: those are dropped, and close as they are
    collected)."""
    root.dispose(close=not root.dialect.is_async)
