"""What both fakes share: a quiet, threaded, keep-alive HTTP server on 127.0.0.1 that
records what it receives and lets a test wait on that record."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import parse_qs

R = TypeVar("R")
T = TypeVar("T")


class LocalServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that knows its owner and its open connections, so `stop()`
    can close idle keep-alive sockets instead of leaving handler threads blocked on them."""

    daemon_threads = True
    allow_reuse_address = True
    # listen() backlog (socketserver's default is 5): a burst of 1,000 clients connecting at
    # once must not overflow it, or the kernel drops SYNs and clients retry a second later.
    request_queue_size = 1024

    def __init__(self, owner: FakeServer[Any], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (or a dropped/stopped connection) is not a fake's bug.
        # Anything else still prints, so a broken fake is visible in the test output.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class QuietHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 with TCP_NODELAY (no 40 ms delayed-ACK stalls), no access log."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: LocalServer
    responded = False

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._guarded("GET")

    def do_POST(self) -> None:
        self._guarded("POST")

    def serve(self, method: str) -> None:
        """Answer one request; subclasses implement it."""
        self.send_bytes(405, b"Method Not Allowed", "text/plain")

    def crash_body(self, error: Exception) -> Any:
        """What to answer when `serve` raised (a bug in the fake, or in its caller's setup)."""
        return {"error": {"message": f"fake server crashed: {error!r}", "type": "fake_error"}}

    def _guarded(self, method: str) -> None:
        self.responded = False
        try:
            self.serve(method)
        except OSError:
            self.close_connection = True
        except Exception as error:  # the process boundary of a test server: report, answer 500
            traceback.print_exc()
            if self.responded:
                self.drop()
            else:
                self.send_json(500, self.crash_body(error))

    def log_message(self, format: str, *args: Any) -> None:
        return

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def header_dict(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}

    def send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.responded = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_bytes(status, body, "application/json; charset=utf-8", headers)

    def drop(self) -> None:
        """Close the socket without answering: the client sees the server disconnect."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class FakeServer(Generic[R]):
    """Lifecycle (`start`/`stop`/context manager), thread-safe recording and `wait_for`.

    Subclasses set `handler_class`, build their URL from `port`, and call `record()` for
    every request. All state changes happen under `self._cond` (an RLock-backed
    Condition), and every `record()` wakes up waiters.
    """

    handler_class: type[QuietHandler]

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._records: list[R] = []
        self._stopping = threading.Event()
        self._httpd: LocalServer | None = None
        self._server_thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = LocalServer(self, self.handler_class)
        self._server_thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        self._server_thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._server_thread
        if httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping in `pause()`
        httpd.shutdown()
        with httpd.connections_lock:
            open_connections = list(httpd.connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._server_thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not started; use start() or `with`")
        return int(self._httpd.server_address[1])

    @property
    def running(self) -> bool:
        return self._httpd is not None

    # recording and waiting -------------------------------------------------------------

    def record(self, item: R) -> None:
        with self._cond:
            self._records.append(item)
            self._cond.notify_all()

    def records(self) -> list[R]:
        with self._cond:
            return list(self._records)

    def clear_records(self) -> None:
        with self._cond:
            self._records.clear()

    def wait_for(self, predicate: Callable[[], T | None], timeout: float = 10.0) -> T:
        """Block until `predicate()` is truthy (re-checked after every recorded request) and
        return its value. Raises TimeoutError with a summary of what was received."""
        with self._cond:
            result = self._cond.wait_for(predicate, timeout=timeout)
            if result:
                return result
            summary = self.describe_records()
        raise TimeoutError(
            f"{type(self).__name__}: condition not met within {timeout} s; {summary}"
        )

    def describe_records(self) -> str:
        return f"{len(self._records)} request(s) recorded"

    def pause(self, seconds: float) -> bool:
        """Sleep in a handler; returns False when the server is stopping (stop() interrupts)."""
        if seconds <= 0:
            return not self._stopping.is_set()
        return not self._stopping.wait(seconds)


def parse_form(body: str) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(body, keep_blank_values=True).items()}
