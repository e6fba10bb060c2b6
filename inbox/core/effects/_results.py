"""A call's result on its way into the effect ledger: its JSON text, whether a failure to
record it means the database refused the result itself, and the results kept in this
process when recording them failed for a reason of timing.

Only a result that cannot be stored (not JSON, or refused by the database: too long for
the column or for the connection) is recorded done without it, which makes every later
attempt raise :class:`~inbox.UncertainEffect`. Any other failure to record ``done`` (a
lost connection, a pool timeout, a deadlock) leaves the record ``started``, and the result
is kept here: the next attempt of the same effect in this process records it and returns
it without calling again (one in another process decides by the mode, as after a crash).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.exc import DataError, DBAPIError

from inbox._backends import refuses_value
from inbox._oneline import describe_error
from inbox.core.effects._identity import EffectRef
from inbox.core.effects._ledger import ResultTooLarge
from inbox.errors import EffectError

__all__ = ["Kept", "KeptResults", "encode_result", "refuses_result", "result_refused"]

_CHAIN_LIMIT: Final = 8
_KEPT_AT_MOST: Final = 10_000


def encode_result(ref: EffectRef, result: object) -> tuple[str | None, EffectError | None]:
    """The JSON text to store for ``result``, or (None, the error to raise) when it cannot
    be stored: the call was made, so that is recorded as done without a result."""
    try:
        # ASCII escapes: any text (a lone surrogate too) fits every column and driver.
        return json.dumps(result, allow_nan=False), None
    except (TypeError, ValueError, RecursionError) as exc:
        error = EffectError(
            f"effect {ref.step!r} of handler {ref.handler!r} returned a result that cannot "
            f"be stored as JSON ({type(exc).__name__}: {exc}). The call was made and is "
            "recorded done without its result: it will not be made again, and every later "
            "attempt raises UncertainEffect until a person releases the record"
        )
        error.__cause__ = exc
        return None, error


def refuses_result(exc: BaseException) -> bool:
    """Whether ``exc``, raised while recording a result, says the database refused the
    result itself (its size or content), as opposed to a failure of timing or connection
    that recording it again could get past."""
    seen: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if seen is None:
            return False
        if isinstance(seen, ResultTooLarge | DataError):
            return True
        if isinstance(seen, DBAPIError) and refuses_value(seen.orig):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def result_refused(ref: EffectRef, exc: BaseException) -> EffectError:
    """The error for a result the database refused to store (too large for the column or
    the connection): the call was made, so it is recorded done without its result."""
    return EffectError(
        f"effect {ref.step!r} of handler {ref.handler!r}: the database refused to store its "
        f"result ({describe_error(exc)}). The call was made and is recorded done without its "
        "result: it will not be made again, and every later attempt raises UncertainEffect "
        "until a person releases the record"
    )


@dataclass(frozen=True, slots=True)
class Kept:
    """A call made as ``attempt`` whose end could not be recorded: its JSON text, or the
    error that says it cannot be stored."""

    attempt: int
    text: str | None
    unstorable: EffectError | None

    def result(self) -> Any:
        """What the handler gets: the result as stored, or the error that it cannot be."""
        if self.unstorable is not None:
            raise self.unstorable
        assert self.text is not None
        return json.loads(self.text)


class KeptResults:
    """The results one inbox could not record yet, by effect key (bounded: the oldest go
    first; a result dropped here is called again, with the same key, as after a crash)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[uuid.UUID, Kept] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, key: uuid.UUID, kept: Kept) -> None:
        """Keep ``kept`` for the next attempt of the effect ``key``."""
        with self._lock:
            self._kept[key] = kept
            self._kept.move_to_end(key)
            while len(self._kept) > _KEPT_AT_MOST:
                self._kept.popitem(last=False)

    def take(self, key: uuid.UUID) -> Kept | None:
        """The kept result of the effect ``key`` (no longer kept), if any."""
        with self._lock:
            return self._kept.pop(key, None)
