"""Count the round trips a piece of code makes to its database server.

Time on a shared machine is noise; the number of times a client waits for the server is
not, and it is what sets the cost of a transaction on any network (multiply by your round
trip time). :class:`RoundTripCounter` is a TCP proxy on loopback in front of the server::

    with RoundTripCounter("127.0.0.1", 5432) as counter:
        engine = create_engine(counter.url("postgresql+psycopg://postgres@127.0.0.1/test"))
        with engine.connect() as connection:  # connecting is counted too: reset after it
            connection.execute(text("SELECT 1"))
            counter.reset()
            ...  # the code to measure
            print(counter.count)

A round trip is counted each time the client sends after the server has answered (or for
the first time on a connection): statements sent together without waiting, as psycopg's
pipeline mode sends them, count once. Everything else is passed through unchanged, after
``latency`` seconds for each answer: a loopback server then behaves like one across a
network (``latency=0.0005`` for a 0.5 ms round trip), to see what round trips cost there.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from types import TracebackType

from sqlalchemy.engine import URL, make_url

from inbox.errors import ConfigurationError

__all__ = ["RoundTripCounter"]

_CHUNK = 65536


class RoundTripCounter:
    """A counting TCP proxy to ``host:port`` on an ephemeral loopback port (a context
    manager: entering starts it, leaving closes it and every connection through it), adding
    ``latency`` seconds to every round trip."""

    def __init__(self, host: str, port: int, *, latency: float = 0.0) -> None:
        if latency < 0:
            raise ConfigurationError(f"latency must be >= 0 seconds, not {latency!r}")
        self._target = (host, port)
        self._latency = latency
        self._lock = threading.Lock()
        self._count = 0
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    @property
    def port(self) -> int:
        """The loopback port to connect to instead of the server's."""
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def count(self) -> int:
        """Round trips since the start or the last :meth:`reset`, over all connections."""
        with self._lock:
            return self._count

    def reset(self) -> None:
        """Start counting from zero."""
        with self._lock:
            self._count = 0

    def url(self, url: str | URL) -> str:
        """``url`` with its host and port replaced by this proxy's (password kept)."""
        rewritten = make_url(url).set(host="127.0.0.1", port=self.port)
        return rewritten.render_as_string(hide_password=False)

    def __enter__(self) -> RoundTripCounter:
        self._spawn(self._accept)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closing.set()
        self._listener.close()
        for sock in list(self._sockets):
            _close(sock)
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                _close(client)
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(sock)
            self._spawn(self._relay, client, server)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        answered = True  # the client's first bytes start a round trip
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ, server)
            selector.register(server, selectors.EVENT_READ, client)
            while not self._closing.is_set():
                for key, _ in selector.select(timeout=0.5):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(_CHUNK)
                    except OSError:
                        data = b""
                    if not data:
                        _close(client)
                        _close(server)
                        return
                    if source is client:
                        if answered:
                            with self._lock:
                                self._count += 1
                            answered = False
                    else:
                        if not answered and self._latency:
                            time.sleep(self._latency)  # the answer's way back
                        answered = True
                    try:
                        key.data.sendall(data)
                    except OSError:
                        _close(client)
                        _close(server)
                        return


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
