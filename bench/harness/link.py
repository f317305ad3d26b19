"""A TCP link that a fault case can cut: a forwarder between a client (the service) and a
server (its database). Cut, it closes every connection it carries and refuses new ones
(what a client sees when a network partition ends its sessions); restored, it forwards
again. Plain threads and sockets: the case runs it inside the test process."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableLink:
    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, name="link-accept", daemon=True).start()

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until `restore`."""
        with self._lock:
            self._cut = True
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._cut
            if refuse:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with self._lock:
                self._open.discard(sock)
            _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
