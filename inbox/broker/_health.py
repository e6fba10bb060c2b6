"""``inbox-worker --metrics-port``: an HTTP endpoint for Prometheus and for probes.

* ``/metrics``: the Prometheus exposition of the inbox's metrics.
* ``/healthz``: 200 while the worker's consume loop turns (its heartbeat is fresher than
  ``stale_after`` seconds), else 503: a process that is alive but stuck.
* ``/readyz``: 200 when the worker consumes (broker connected, consumers ready) and the
  database is reachable with its tables at the needed revision, else 503 with the reasons,
  one per line.

A stdlib ``ThreadingHTTPServer`` in a daemon thread: a slow check never blocks the worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from inbox.telemetry._prometheus import Exposition

__all__ = ["DEFAULT_STALE_AFTER", "HealthServer", "Probed"]

logger = logging.getLogger("inbox.worker")

DEFAULT_STALE_AFTER = 60.0
"""Seconds without a turn of the consume loop after which ``/healthz`` says 503."""


class Probed(Protocol):
    """What the endpoint reads from the worker (from another thread: plain attributes)."""

    @property
    def heartbeat(self) -> float:
        """``time.monotonic()`` when the consume loop last turned."""

    @property
    def consuming(self) -> bool:
        """Connected to the broker, consumers ready."""


class HealthServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` for ``worker`` on ``host:port``
    (port 0: any free port, see :attr:`port`). ``database`` says why the database is not
    ready (None: it is); ``metrics`` renders the Prometheus exposition (None: 404)."""

    def __init__(
        self,
        worker: Probed,
        host: str,
        port: int,
        *,
        database: Callable[[], str | None],
        metrics: Exposition | None,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        self._worker = worker
        self._database = database
        self._metrics = metrics
        self._stale_after = stale_after
        self._checking = threading.Lock()  # one database check at a time
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="inbox-health", daemon=True
        )

    @property
    def port(self) -> int:
        """The port the endpoint listens on."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread.start()
        host = self._server.server_address[0]
        logger.info(
            "metrics and health on http://%s:%d (/metrics /healthz /readyz)", host, self.port
        )

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def respond(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        """The status, body and content type for a GET of ``path``."""
        route = path.split("?", 1)[0]
        if route == "/metrics" and self._metrics is not None:
            body, content_type = self._metrics()
            return HTTPStatus.OK, body, content_type
        if route == "/healthz":
            return self._text(*self._liveness())
        if route == "/readyz":
            return self._text(*self._readiness())
        return self._text(HTTPStatus.NOT_FOUND, "not found: /metrics /healthz /readyz")

    def _liveness(self) -> tuple[HTTPStatus, str]:
        quiet = time.monotonic() - self._worker.heartbeat
        if quiet > self._stale_after:
            return HTTPStatus.SERVICE_UNAVAILABLE, (
                f"stale: the consume loop has not turned for {quiet:.0f} s "
                f"(limit {self._stale_after:g} s)"
            )
        return HTTPStatus.OK, "ok"

    def _readiness(self) -> tuple[HTTPStatus, str]:
        reasons = []
        if not self._worker.consuming:
            reasons.append("broker: not consuming (connecting, or reconnecting)")
        database = self._database_check()
        if database is not None:
            reasons.append(f"database: {database}")
        if reasons:
            return HTTPStatus.SERVICE_UNAVAILABLE, "\n".join(reasons)
        return HTTPStatus.OK, "ready"

    def _database_check(self) -> str | None:
        # A database that does not answer can hold a check until the driver's connect
        # timeout: later probes say so instead of piling up threads behind it.
        if not self._checking.acquire(blocking=False):
            return "the previous check has not finished (the database does not answer)"
        try:
            return self._database()
        finally:
            self._checking.release()

    @staticmethod
    def _text(status: HTTPStatus, text: str) -> tuple[HTTPStatus, bytes, str]:
        return status, f"{text}\n".encode(), "text/plain; charset=utf-8"


def _handler_for(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                status, body, content_type = server.respond(self.path)
            except Exception as exc:  # a failing check is a 500 line, never a dead endpoint
                logger.warning("%s failed: %s", self.path, type(exc).__name__)
                status, body, content_type = HealthServer._text(
                    HTTPStatus.INTERNAL_SERVER_ERROR, type(exc).__name__
                )
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a probe every few seconds is not worth a log line

    return Handler
