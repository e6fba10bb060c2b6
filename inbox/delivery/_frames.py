"""The first application frame of a failure: where in the application's own code it happened.

A dead letter's ``x-inbox-error-frame`` header (:data:`inbox.delivery.headers.ERROR_FRAME`)
names, for each handler that failed for good, the innermost frame of its exception's
traceback that is the application's: not in the inbox package, not in an installed package
(site-packages), not in the standard library. Two handlers raising the same exception from
different lines then fall in different failure groups
(:mod:`inbox.operations._failure_groups`). It is computed only when a delivery is
dead-lettered after a handler failed, never on the success path. Nothing here does I/O.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Mapping
from types import TracebackType
from typing import Final

__all__ = ["MAX_FRAME_CHARS", "application_frame", "error_frames"]

MAX_FRAME_CHARS: Final = 500
"""The longest ``x-inbox-error-frame`` value, in characters."""


def _prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # the inbox package
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(name):
            found.add(os.path.abspath(paths[name]))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in found))


_NOT_APPLICATION: Final = _prefixes()


def _is_application(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>: not a file of the application
        return False
    path = os.path.abspath(filename)
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    return not path.startswith(_NOT_APPLICATION)


def application_frame(exc: BaseException) -> str | None:
    """``module:function:line`` of the innermost application frame of ``exc``'s traceback
    (the module by its import name, the same on every machine), or None when every frame is
    the inbox's, an installed package's or the standard library's."""
    tb: TracebackType | None = exc.__traceback__
    found: str | None = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if _is_application(code.co_filename):
            module = tb.tb_frame.f_globals.get("__name__")
            where = module if isinstance(module, str) else os.path.basename(code.co_filename)
            found = f"{where}:{code.co_name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def error_frames(failures: Mapping[str, BaseException]) -> str | None:
    """The ``x-inbox-error-frame`` value for the handlers that failed: ``handler@frame`` for
    each that has an application frame, joined by ``; `` and cut to
    :data:`MAX_FRAME_CHARS`; None when none has one."""
    parts = []
    for name, exc in failures.items():
        frame = application_frame(exc)
        if frame is not None:
            parts.append(f"{name}@{frame}")
    if not parts:
        return None
    value = "; ".join(parts)
    return value if len(value) <= MAX_FRAME_CHARS else value[: MAX_FRAME_CHARS - 1] + "…"
