"""What the workers' ``/readyz`` says (``inbox-worker --metrics-port``, docs/operations.md):
read over HTTP, a few at once, each with a short timeout, for a person's overview."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from inbox._cli import mask_urls
from inbox._oneline import bounded
from inbox.errors import ConfigurationError

__all__ = ["WorkerReadiness", "check_worker_url", "read_readiness"]

_MAX_ANSWER: Final = 4096
_TIMEOUT: Final = 2.0


@dataclass(frozen=True, slots=True)
class WorkerReadiness:
    """One worker's answer: ``ready``, and its reasons (the lines of a 503), or ``error``
    when it could not be asked (down, refused, timed out)."""

    url: str
    """The URL asked, its password masked."""
    ready: bool
    reasons: tuple[str, ...] = ()
    error: str | None = None


def check_worker_url(url: str) -> str:
    """A worker's endpoint as given (``http://host:9100``, ``/readyz`` added when absent);
    ``ValueError`` for anything but an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"a worker is an http(s)://HOST:PORT URL, got {mask_urls(url)!r}")
    if parts.path.rstrip("/").endswith("/readyz"):
        return url
    return url.rstrip("/") + "/readyz"


def _ask(url: str, timeout: float) -> WorkerReadiness:
    shown = mask_urls(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # http(s) only: check_worker_url
            return WorkerReadiness(shown, True)
    except urllib.error.HTTPError as exc:
        with exc:
            text = exc.read(_MAX_ANSWER).decode("utf-8", "replace")
        reasons = tuple(bounded(line, 300) for line in text.splitlines() if line.strip())
        return WorkerReadiness(shown, False, reasons or (f"HTTP {exc.code}",))
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out
        reason = getattr(exc, "reason", exc)
        return WorkerReadiness(shown, False, error=bounded(mask_urls(str(reason)), 300))


def read_readiness(urls: Sequence[str], timeout: float = _TIMEOUT) -> list[WorkerReadiness]:
    """Ask every worker's ``/readyz`` at once (each URL checked by
    :func:`check_worker_url`); the answers in the order of ``urls``."""
    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        return list(pool.map(lambda url: _ask(url, timeout), urls))
