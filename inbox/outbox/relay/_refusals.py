"""What the relay records about a row the broker refused: one bounded line without row data
(:mod:`inbox._oneline`), and when to try it again (an exponential backoff from
:class:`inbox.core._retry.Backoff`, capped)."""

from __future__ import annotations

from typing import Final

from inbox._oneline import describe_error
from inbox.core._retry import Backoff

__all__ = ["error_line", "refusal_delay"]

_ALWAYS: Final = Backoff(retries=64, base_delay=0.5, retryable=lambda exc: True)
_DOUBLINGS: Final = 20  # 0.5 s * 2**20 is far past any cap: no need to grow further


def error_line(exc: BaseException) -> str:
    """``Type: first line`` of ``exc`` on one bounded line (a database error: the driver's
    first line, never the SQL or its parameters)."""
    return describe_error(exc)


def refusal_delay(attempts: int, cap: float) -> float:
    """Seconds before trying again a row refused ``attempts`` times (this refusal counted):
    about 1 s, 2 s, 4 s, ... jittered, at most ``cap``."""
    reruns = min(max(attempts - 1, 0), _DOUBLINGS)
    delay = _ALWAYS.delay_after(RuntimeError("refused"), reruns)
    return min(cap, delay if delay is not None else cap)
