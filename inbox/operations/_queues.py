"""The live queues, for a person watching them: each queue's depth, unacked messages,
consumers and in/out rates, from RabbitMQ's management API when its URL is given (else the
depth and consumers from a passive declare, and the out rate from the workers' counters),
and each worker's processed / failed / duplicate counts and consumed messages per queue,
from its ``/metrics`` (``inbox-worker --metrics-port``), with when it last answered.

Rates without the management API are the change of the workers' consumed counters between
two looks (:class:`Watch` keeps the last look), so the first look has none."""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, unquote, urlsplit

import amqp

from inbox._cli import mask_urls
from inbox._oneline import bounded
from inbox.errors import ConfigurationError
from inbox.operations import _dead_letters as _dlq

__all__ = [
    "QueueStats",
    "Watch",
    "WorkerStats",
    "check_management_url",
    "metrics_url",
    "parse_metrics",
    "read_queues",
    "read_workers",
]

_TIMEOUT: Final = 2.0
_MAX_METRICS: Final = 1_000_000
_PROCESSED: Final = "inbox_processed_total"
_FAILURES: Final = "inbox_failures_total"
_DUPLICATES: Final = "inbox_duplicates_total"
_CONSUMED: Final = "messaging_client_consumed_messages_total"
_QUEUE_LABEL: Final = "messaging_destination_name"


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue now: None for what the source does not say (unacked and rates need the
    management API; rates need two looks)."""

    name: str
    depth: int | None = None
    unacked: int | None = None
    consumers: int | None = None
    in_rate: float | None = None
    out_rate: float | None = None
    source: str = "amqp"
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """One worker's counters (None: it did not answer), and when it last answered."""

    url: str
    processed: float | None = None
    failed: float | None = None
    duplicates: float | None = None
    consumed: dict[str, float] = field(default_factory=dict)
    last_seen: float | None = None
    """``time.time()`` of its last answer to this console (None: never)."""
    error: str | None = None


def check_management_url(url: str) -> str:
    """RabbitMQ's management API as given (``http://user:password@host:15672``);
    ConfigurationError for anything but an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"the management API is an http(s)://USER:PASSWORD@HOST:15672 URL, got "
            f"{mask_urls(url)!r}"
        )
    return url.rstrip("/")


def metrics_url(readiness_url: str) -> str:
    """A worker's ``/metrics`` beside the ``/readyz`` the console is given."""
    base = readiness_url.rstrip("/")
    return base.removesuffix("/readyz") + "/metrics"


class Watch:
    """What the console saw at its last look, kept between looks (thread-safe): each
    worker's last answer and consumed counters, for its last-seen time and the rates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._consumed: dict[str, tuple[float, float]] = {}

    def saw(self, url: str, at: float) -> float | None:
        """Record an answer of ``url`` at ``at`` (None: it did not answer); its last one."""
        with self._lock:
            if not math.isnan(at):
                self._seen[url] = at
            return self._seen.get(url)

    def rate(self, queue: str, total: float, at: float) -> float | None:
        """Messages a second consumed from ``queue`` since the last look, by the counters'
        ``total`` now (None on the first look, or after a worker restarted)."""
        with self._lock:
            before = self._consumed.get(queue)
            self._consumed[queue] = (total, at)
        if before is None or at <= before[1] or total < before[0]:
            return None
        return (total - before[0]) / (at - before[1])


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of a Prometheus text exposition: name -> [(labels, value)]."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        labels: dict[str, str] = {}
        if rest:
            inside, _, value_text = rest.rpartition("}")
            for pair in _label_pairs(inside):
                key, _, quoted = pair.partition("=")
                labels[key.strip()] = quoted.strip().strip('"')
        else:
            name, _, value_text = line.partition(" ")
        try:
            number = float(value_text.split()[0])
        except (IndexError, ValueError):
            continue
        samples.setdefault(name.strip(), []).append((labels, number))
    return samples


def _label_pairs(inside: str) -> list[str]:
    pairs, current, quoted = [], "", False
    for char in inside:
        if char == '"' and not current.endswith("\\"):
            quoted = not quoted
        if char == "," and not quoted:
            pairs.append(current)
            current = ""
        else:
            current += char
    return [*pairs, current] if current else pairs


def read_workers(urls: Sequence[str], watch: Watch) -> list[WorkerStats]:
    """Every worker's ``/metrics`` at once (``urls``: their ``/readyz``), in order."""
    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        return list(pool.map(lambda url: _worker(url, watch), urls))


def _worker(url: str, watch: Watch) -> WorkerStats:
    shown = mask_urls(url)
    try:
        with urllib.request.urlopen(metrics_url(url), timeout=_TIMEOUT) as answer:
            text = answer.read(_MAX_METRICS).decode("utf-8", "replace")
    except (OSError, ValueError) as exc:  # down, refused, timed out, a 404 (no otel extra)
        reason = getattr(exc, "reason", exc)
        last = watch.saw(url, math.nan)
        return WorkerStats(shown, last_seen=last, error=bounded(mask_urls(str(reason)), 300))
    samples = parse_metrics(text)
    consumed: dict[str, float] = {}
    for labels, value in samples.get(_CONSUMED, []):
        queue = labels.get(_QUEUE_LABEL, "?")
        consumed[queue] = consumed.get(queue, 0.0) + value
    return WorkerStats(
        shown,
        _total(samples, _PROCESSED),
        _total(samples, _FAILURES),
        _total(samples, _DUPLICATES),
        consumed,
        watch.saw(url, time.time()),
    )


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(value for _, value in samples.get(name, []))


def read_queues(
    broker: str,
    queues: Sequence[str],
    workers: Sequence[WorkerStats],
    watch: Watch,
    management: str | None = None,
) -> list[QueueStats]:
    """Each of ``queues`` now: from the management API when given, else a passive declare
    (depth, consumers) and the workers' consumed counters (the out rate)."""
    now = time.time()
    found = []
    for queue in queues:
        total = sum(w.consumed.get(queue, 0.0) for w in workers)
        # A worker that answered and has no sample for the queue consumed none from it yet.
        answered = any(w.error is None for w in workers)
        out_rate = watch.rate(queue, total, now) if answered else None
        if management is not None:
            found.append(_from_management(management, broker, queue, out_rate))
        else:
            found.append(_from_amqp(broker, queue, out_rate))
    return found


def _from_amqp(broker: str, queue: str, out_rate: float | None) -> QueueStats:
    try:
        with _dlq.open_channel(broker) as channel:
            declared = channel.queue_declare(queue=queue, passive=True)
    except amqp.exceptions.NotFound:
        return QueueStats(queue, error="no such queue (no worker declared it yet)")
    except Exception as exc:  # one queue's failure is part of the page, not its end
        return QueueStats(queue, error=f"broker: {bounded(mask_urls(str(exc)), 300)}")
    return QueueStats(
        queue,
        int(declared.message_count),
        None,
        int(declared.consumer_count),
        None,
        out_rate,
    )


def _from_management(
    management: str, broker: str, queue: str, out_rate: float | None
) -> QueueStats:
    parts = urlsplit(management)
    vhost = unquote(urlsplit(broker).path[1:]) or "/"
    url = (
        f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"
        f"{parts.path}/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}"
    )
    request = urllib.request.Request(url)
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as answer:  # http(s) only
            found: dict[str, Any] = json.loads(answer.read(_MAX_METRICS))
    except urllib.error.HTTPError as exc:
        with exc:
            why = "no such queue" if exc.code == 404 else f"HTTP {exc.code}"
        return QueueStats(queue, source="management", error=f"management API: {why}")
    except (OSError, ValueError) as exc:
        reason = bounded(mask_urls(str(getattr(exc, "reason", exc))), 300)
        return QueueStats(queue, source="management", error=f"management API: {reason}")
    # No message_stats yet: nothing was published or delivered since the queue began.
    stats = found.get("message_stats") or {}
    return QueueStats(
        queue,
        _int(found.get("messages_ready")),
        _int(found.get("messages_unacknowledged")),
        _int(found.get("consumers")),
        _rate(stats, "publish_details"),
        _rate(stats, "deliver_get_details") if "deliver_get_details" in stats else out_rate,
        "management",
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rate(stats: dict[str, Any], name: str) -> float:
    """A rate of the queue's ``message_stats``: absent, nothing of that kind was counted."""
    details = stats.get(name)
    rate = details.get("rate") if isinstance(details, dict) else None
    return float(rate) if isinstance(rate, int | float) else 0.0
