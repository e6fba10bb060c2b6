"""``FakeProvider``: a stand-in for the service behind ``inbox.effect`` (an SMS gateway, a
payment provider) that counts its calls per idempotency key and fails or hangs on cue."""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Hashable
from typing import Any

from inbox.errors import ConfigurationError

__all__ = ["FakeProvider", "FakeProviderError"]

_LIVE: weakref.WeakSet[FakeProvider] = weakref.WeakSet()


class FakeProviderError(Exception):
    """The failure a :class:`FakeProvider` raises when told to fail."""


class FakeProvider:
    """A callable to pass to ``inbox.effect(step, provider)``: ``provider(key)`` records the
    call under ``key`` and returns a receipt, ``{"receipt": "<name>-<key>", "key": "<key>"}``
    (the same for every call with one key, as an idempotent provider answers).

    It also stands in for an outside API a handler calls directly: ``key`` may be any
    hashable value (an order id, a string) or left out. ``assert_idempotent`` counts the calls
    of every FakeProvider alive during the assertion, and fails when a redelivery made more
    calls than one clean run: the mark of a call made outside ``inbox.effect``.

    ``fail(times)`` makes the next ``times`` calls raise (a :class:`FakeProviderError`, or
    the given error) after recording them, as a provider that took the request and answered
    with an error. ``hang(times, timeout)`` makes the next ``times`` calls block until
    :meth:`release` or ``timeout`` seconds, then raise :class:`TimeoutError` (a client
    timeout: the other side may or may not have acted). Thread-safe.
    """

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.calls: Counter[Hashable] = Counter()
        """How many times each key was called, failed and hung calls included."""
        self._lock = threading.Lock()
        self._failures: list[Exception] = []
        self._hangs: list[float] = []
        self._released = threading.Event()
        self.hanging = threading.Event()
        """Set while a call hangs: wait on it to act at that moment (stop, crash, retry)."""
        _LIVE.add(self)

    def __call__(self, key: Hashable = None) -> dict[str, Any]:
        """Make the fake call under ``key``: the effect's idempotency key (a UUID), or what
        a direct call passes (any hashable value, or nothing)."""
        if not isinstance(key, Hashable):
            raise ConfigurationError(f"FakeProvider needs a hashable key, got {type(key).__name__}")
        with self._lock:
            self.calls[key] += 1
            failure = self._failures.pop(0) if self._failures else None
            hang = self._hangs.pop(0) if failure is None and self._hangs else None
        if failure is not None:
            raise failure
        if hang is not None:
            self.hanging.set()
            try:
                released = self._released.wait(hang)
            finally:
                self.hanging.clear()
            if not released:
                raise TimeoutError(f"{self.name}: no answer within {hang:g} s (key {key})")
        return {"receipt": f"{self.name}-{key}", "key": str(key)}

    def fail(self, times: int = 1, error: Exception | None = None) -> None:
        """Make the next ``times`` calls raise ``error`` (default: a FakeProviderError)."""
        _check_times(times)
        with self._lock:
            for attempt in range(times):
                self._failures.append(
                    error or FakeProviderError(f"{self.name}: failing on cue ({attempt + 1})")
                )

    def hang(self, times: int = 1, timeout: float = 5.0) -> None:
        """Make the next ``times`` calls block until :meth:`release`, or ``timeout``
        seconds and then raise TimeoutError."""
        _check_times(times)
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be positive, got {timeout!r}")
        with self._lock:
            self._released.clear()
            self._hangs.extend([timeout] * times)

    def release(self) -> None:
        """Let hanging calls (and later ones told to hang) return their receipts at once."""
        self._released.set()

    @property
    def total_calls(self) -> int:
        """Calls made, over every key."""
        return self.calls.total()

    def calls_for(self, key: Hashable) -> int:
        """Calls made under ``key``."""
        return self.calls[key]

    def counts(self) -> Counter[Hashable]:
        """A copy of :attr:`calls`, taken under the lock."""
        with self._lock:
            return self.calls.copy()


def live_providers() -> list[FakeProvider]:
    """Every :class:`FakeProvider` still referenced somewhere, in no particular order."""
    return list(_LIVE)


def _check_times(times: int) -> None:
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ConfigurationError(f"times must be a positive int, got {times!r}")
