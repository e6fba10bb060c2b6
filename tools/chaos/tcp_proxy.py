"""A TCP proxy the Celery chaos run puts between its workers and the broker: ``cut()`` closes
every connection it carries (a broker connection drop, as a network cut or a broker restart
looks to the worker) while new connections keep being accepted. Only the workers' own
connections go through it, so other users of the shared broker are never touched."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Final

_CHUNK: Final = 65536


class TcpProxy:
    """Listens on 127.0.0.1 (a free port) and forwards each connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        self.connections_cut = 0
        self.accepted = 0
        self._closed = False
        threading.Thread(target=self._accept, name="chaos-proxy", daemon=True).start()

    def cut(self) -> int:
        """Close every connection carried now; returns how many client connections it cut."""
        with self._lock:
            carried, self._open = self._open, []
        for sock in carried:
            _close(sock)
        cut = len(carried) // 2  # each client connection is two sockets
        self.cuts += 1
        self.connections_cut += cut
        return cut

    def close(self) -> None:
        """Stop accepting and cut what is open."""
        self._closed = True
        _close(self._server)
        with self._lock:
            carried, self._open = self._open, []
        for sock in carried:
            _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
