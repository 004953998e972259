"""A TCP proxy in front of a Redis that lets the first `through` connections pass, then cuts
every connection opened after them (accepted and closed at once: redis-py reads "Connection
closed by server") for `cut_seconds`, then passes them again. What a process sees when Redis
goes away right after its start-up check (a failover or a restart just then): its check's
connection passes, the next ones it opens do not."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable


class CuttingProxy:
    def __init__(
        self,
        target: tuple[str, int],
        *,
        through: int,
        cut_seconds: float,
        before: Callable[[int], object] | None = None,
    ) -> None:
        """`before(n)` runs as the n-th connection is accepted, before it is cut or passed."""
        self.target = target
        self.through = through
        self.cut_seconds = cut_seconds
        self.before = before
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted = 0
        self.cut = 0  # connections closed at once
        self.cut_since: float | None = None
        self._stop = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    def __enter__(self) -> CuttingProxy:
        self._accepting.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        with contextlib.suppress(OSError):
            self.listener.close()
        self._accepting.join(5)

    def _cutting(self) -> bool:
        if self.accepted <= self.through:
            return False
        now = time.monotonic()
        if self.cut_since is None:
            self.cut_since = now
        return now - self.cut_since < self.cut_seconds

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.before is not None:
                self.before(self.accepted)
            if self._cutting():
                self.cut += 1
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, 5)
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()
