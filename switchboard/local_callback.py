"""The console's end of connecting: a one-shot OAuth callback on 127.0.0.1.

`switchboard chat` has no public URL. When a per-user tool finds the person at the terminal
not connected, the console starts a flow whose redirect URI is this listener's
(`http://127.0.0.1:<a free port>/oauth/callback`, a loopback redirect as RFC 8252 has it),
prints the provider's URL and waits here. The browser comes back; the flow is finished with
`connections.complete` and, as the person at the terminal is the one who started it,
confirmed at once with `connections.confirm` as the console's own team and user, so the
user verifier is the same check as in Slack. Only the `state` this console started is
taken: any other callback is refused (nothing changes) and the listener goes on waiting.
After ours, whatever its outcome, the console closes the listener.

Why uvicorn rather than the standard library's `http.server`: uvicorn is already a
dependency (the bot's HTTP server), and through it this listener reuses that server's
whole-request deadline and connection cap (`server_config`) and its `respond`, so a slow or
flooding local client cannot hold the console. `http.server` would need timeouts and thread
handling of its own for the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import threading
import time
from urllib.parse import parse_qs, urlsplit

import structlog
import uvicorn

from bot.transport import oauth_callback
from bot.transport.http_server import Limits, Receive, Scope, Send, respond, server_config
from worker.runtime import Runtime
from worker.service import connections
from worker.service.connections import Connected, ConnectRefused

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
WAKE_EVERY = 0.2  # seconds: how soon a Ctrl-C is seen while waiting
LIMITS = Limits(request_seconds=10.0, idle_seconds=1, max_connections=16)
NOT_OURS = "This is not the connection this console is waiting for. Nothing was changed."
TAKEN = "This connection was already finished. Nothing was changed."
FAILED = "Switchboard could not finish connecting (its log says why). Nothing was connected."

Outcome = Connected | ConnectRefused


class LocalCallback:
    """Bound at construction on `port` (0: a free one; OSError when it cannot be had), so
    `redirect_uri` is known at once; `start` begins the flow and serves, `wait` returns its
    outcome, `close` stops serving and frees the port."""

    def __init__(self, rt: Runtime, team: str, user: str, port: int = 0) -> None:
        self.rt, self.team, self.user = rt, team, user
        self.socket = socket.create_server((HOST, port))
        self.socket.setblocking(False)
        self.port = int(self.socket.getsockname()[1])
        self.redirect_uri = f"http://{HOST}:{self.port}{connections.CALLBACK_PATH}"
        self._state = ""
        self._outcome: Outcome | None = None
        self._done = threading.Event()
        self._taken = threading.Lock()  # held by the one callback that finishes the flow
        self.server = uvicorn.Server(server_config(self, LIMITS, graceful_seconds=1))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def start(self, provider: str) -> str:
        """Start the person's flow for `provider` and serve; the URL to open in a browser.
        ConnectRefused when it cannot be started (no such provider, provider down)."""
        url = connections.connect_url(
            self.rt, self.team, self.user, provider, callback=self.redirect_uri
        )
        self._state = parse_qs(urlsplit(url).query).get("state", [""])[0]
        self.thread.start()
        return url

    def wait(self, seconds: float) -> Outcome | None:
        """The outcome of our callback; None when it did not come within `seconds`. Ctrl-C
        (KeyboardInterrupt) interrupts the wait: it waits in slices of WAKE_EVERY, since
        Python runs the SIGINT handler in the main thread only between bytecodes, and a
        signal the kernel gave another thread (the listener's, say) would otherwise not be
        seen until one long wait ended (seen: a test's SIGINT waited out the 300 s)."""
        deadline = time.monotonic() + seconds
        while not self._done.wait(min(WAKE_EVERY, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return None
        return self._outcome

    def close(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(5)
        with contextlib.suppress(OSError):
            self.socket.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "GET" or scope["path"] != connections.CALLBACK_PATH:
            await respond(send, 404, {"error": "not found"})
            return
        query = scope["query_string"].decode("latin-1")
        try:
            status, page, ours = await asyncio.get_running_loop().run_in_executor(
                None, self.finish, query
            )
        except Exception:  # boundary: the person is told, the console stops waiting
            log.exception("local_callback_failed")
            self._outcome = ConnectRefused(FAILED)
            status, page, ours = 500, oauth_callback.refused_page(FAILED), True
        await respond(send, status, page, oauth_callback.HEADERS)
        if ours:
            self._done.set()

    def finish(self, query_string: str) -> tuple[int, str, bool]:
        """Finish and confirm the flow when the callback is ours: (status, page, ours)."""
        query = oauth_callback.read_query(query_string)
        state = (query or {}).get("state", "")
        if query is None or not self._state or not _same(state, self._state):
            return 400, oauth_callback.refused_page(NOT_OURS), False
        if not self._taken.acquire(blocking=False):
            return 400, oauth_callback.refused_page(TAKEN), False
        try:
            finished = connections.complete(
                self.rt,
                state,
                code=query.get("code", ""),
                error=query.get("error", ""),
                description=query.get("error_description", ""),
            )
            connected = connections.confirm(self.rt, self.team, self.user, finished.code)
        except ConnectRefused as refused:
            self._outcome = refused
            return 400, oauth_callback.refused_page(str(refused)), True
        self._outcome = connected
        return 200, oauth_callback.connected_page(connected.label), True


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
