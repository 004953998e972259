"""The model server's connections as httpcore2 opens them (worker/model.py's `_Direct`), with
two costs of every request taken out (issue 28; measured in the default burst's worker):

- httpcore2 writes a request's head and its body in two sends; each send through gevent's
  socket is a wrapper, a system call and a timer for its timeout. A request is written here
  in one, when its reply is first read (or sooner, past 64 KiB).
- Before it reuses a pooled connection, httpcore2 asks whether the server closed it, with
  `select.poll`: gevent's own in a worker, through the event loop (1.1 % of the worker's
  CPU). Asked here with poll(2) itself (worker/poll.py).

HTTP/1.1 only (the pool's, which offers no other): every request there ends in a read of
its reply, which is what sends it. Nothing else differs: a write that fails is taken as
httpcore2 takes it (the reply is read all the same: a server may answer, then close, before
reading a whole request), and a write that times out raises as it did."""

from __future__ import annotations

import contextlib
from typing import Any

import httpcore2

from worker.poll import readable_now

HELD_BYTES = 64 * 1024  # a body larger than this is sent as it comes, not held whole


class OneWriteStream(httpcore2.NetworkStream):
    def __init__(self, stream: httpcore2.NetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._held.append(buffer)
            self._size += len(buffer)
        self._timeout = timeout
        if self._size >= HELD_BYTES:
            self._send()

    def _send(self) -> None:
        if self._held:
            held, self._held, self._size = b"".join(self._held), [], 0
            self._stream.write(held, self._timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        # as httpcore2 takes a failed write: what the server sent, or its close, is read next
        with contextlib.suppress(httpcore2.WriteError):
            self._send()
        return self._stream.read(max_bytes, timeout)

    def close(self) -> None:
        self._held, self._size = [], 0
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        self._send()
        return OneWriteStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            sock = self._stream.get_extra_info("socket")
            fd = -1 if sock is None else sock.fileno()
            return fd < 0 or readable_now(fd)  # a closed socket reads as readable, as before
        return self._stream.get_extra_info(info)


class OneWriteBackend(httpcore2.SyncBackend):
    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return OneWriteStream(super().connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore2.NetworkStream:
        return OneWriteStream(super().connect_unix_socket(*args, **kwargs))
