"""The HTTP server of `switchboard bot --http`: uvicorn (asyncio, h11) in front of Bolt.

Why not the thread-per-connection server this replaced (issue 21, item 1): 70 connections
that each sent one header line every 4 s held all 64 of its threads, since its timeout
was per `recv` and a trickle never hits it, and Slack's signed events got 503. Here a
connection costs a socket and a few kB on one event loop, not a thread, and:

- **a whole-request deadline**: headers and body must arrive within `request_seconds` of
  the connection's start (or of the previous answer on a kept-alive one), or the
  connection gets a 408 and is closed, however steadily it trickles. uvicorn has none of
  its own (its `timeout_keep_alive` is reset by every byte received; encode/uvicorn#157
  asks for `--timeout-request-start`), so `_Protocol` adds it to uvicorn's h11 protocol;
- **a bounded pool that only whole, signed requests reach**: Bolt's `dispatch` is
  blocking (it waits for the listener's `ack`, up to 3 s), so it runs on
  `dispatch_threads` threads, with at most `dispatch_queue` requests waiting for one
  (503 past that). A slow client never holds one: the body is read and its signature
  checked on the event loop first. `/healthz` and `/metrics` ask Redis, on a pool of
  their own;
- **a connection cap** (`max_connections`: 1,000, or half the open-file limit if that is
  lower), so file descriptors stay bounded: past it a connection gets a 503 with
  `Retry-After` at once, as before; and a budget for the bodies being read at once
  (`body_budget`, 64 MB), so memory does too.

Bolt's own ASGI adapter (`slack_bolt.adapter.asgi`) is not used: for the sync `App` it calls
`dispatch` on the event loop itself (one slow listener would stall every connection), reads
any body whole with no size limit, and would let Bolt parse a body before our checks.
`SlackEvents` does what it does, in that order: signature on the raw body
(`bot.transport.signature`, 401), envelope (`bot.transport.envelope`, 400), then
`App.dispatch`.

In Socket Mode Slack needs no port, but people's browsers do when per-user connections are
set up: `callback_server` is the same server with no Bolt app, serving `GET /oauth/callback`
alone (every other path 404, `/slack/events` too, so nothing reachable at
SWITCHBOARD_PUBLIC_URL takes events; metrics and probes stay on `--metrics-port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
import redis
import structlog
import uvicorn
from slack_bolt import App, BoltRequest
from slack_bolt.response import BoltResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from bot.transport import envelope, oauth_callback, signature
from bot.transport.payloads import request_kind
from worker import metrics, tracing
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

EVENTS_PATH = "/slack/events"
HEALTH_PATH = metrics.HEALTH_PATH  # Redis answers: ready
LIVE_PATH = metrics.LIVE_PATH  # the process answers: alive (asks nothing else)
MAX_BODY = 1_000_000  # Slack's payloads are far smaller; a bigger body is not from Slack
MAX_HEADERS = 16 * 1024  # request line and headers together (h11's default, said here)
LOG_EVERY = 10.0  # seconds between two warnings of one kind (busy, timed out)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    """What one client may hold, and for how long."""

    request_seconds: float = 10.0  # headers + body; Slack sends both at once, in ms
    idle_seconds: int = 5  # a kept-alive connection with no new request is closed
    # open sockets, each a few kB, not a thread; below the process's file limit, so that
    # accept() never fails for want of a descriptor (asyncio then stops accepting for 1 s)
    max_connections: int = field(default_factory=lambda: default_max_connections())
    dispatch_threads: int = 16  # Bolt dispatches at once (each waits up to 3 s for ack)
    dispatch_queue: int = 64  # whole, signed requests waiting for a dispatch thread
    max_body: int = MAX_BODY
    # bodies being read, all connections together: 1,000 clients sending 1 MB each must not
    # take 1 GB (the old server's 64 threads held at most 64 MB)
    body_budget: int = 64 * MAX_BODY


def default_max_connections(wanted: int = 1000) -> int:
    """`wanted`, or half the soft limit on open files when that is lower (Redis, Slack and
    the model need descriptors too)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft // 2))


BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 17\r\nConnection: close\r\n\r\n{"error": "busy"}'
)
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b'Content-Length: 22\r\nConnection: close\r\n\r\n{"error": "too slow"}\n'
)
_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)  # the client's request is in


class Tally:
    """Counts one kind of refusal and warns about it at most every LOG_EVERY seconds, so
    a flood of slow or surplus connections is a few log lines, not one per connection."""

    def __init__(self, event: str, **fields: Any) -> None:
        self.event = event
        self.fields = fields
        self.count = 0
        self.logged = float("-inf")

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged >= LOG_EVERY:
            log.warning(self.event, refused=self.count, **self.fields)
            self.count, self.logged = 0, now


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a whole-request deadline and a connection cap.

    The deadline is armed when the connection opens and again after each answer, and
    disarmed once the request is in (h11's view of the client: DONE), so a request that
    is being answered is never cut, only one that is being sent too slowly."""

    limits: ClassVar[Limits]
    timed_out: ClassVar[Tally]
    busy: ClassVar[Tally]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse()
            return
        self._arm()

    def _refuse(self) -> None:
        """503 at once; the socket is half-closed so the client reads the answer (a close
        with its request unread would reset the connection instead)."""
        self._refused = True
        self.busy.add()
        self.transport.write(BUSY_RESPONSE)
        with contextlib.suppress(OSError, NotImplementedError):
            self.transport.write_eof()
        self.loop.call_later(1.0, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state in _RECEIVED:
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # for the next request on this connection (pipelined ones disarm it)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if exc is not None:  # reset, broken pipe: a client that hung up is not an error
            log.info("http_connection_aborted", error=type(exc).__name__)
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.request_seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.timed_out.add()
        answered = self.cycle is not None and self.cycle.response_started
        if self.conn.their_state is h11.IDLE or not answered:
            self.transport.write(TIMEOUT_RESPONSE)  # raw: h11 has no response for no request
        self.transport.close()  # the app reading the body sees `http.disconnect`


def protocol_class(limits: Limits) -> type[_Protocol]:
    """`_Protocol` with these limits (uvicorn builds one instance per connection)."""
    return type(
        "SlackHTTPProtocol",
        (_Protocol,),
        {
            "limits": limits,
            "timed_out": Tally("http_request_timeout", request_seconds=limits.request_seconds),
            "busy": Tally("http_busy", max_connections=limits.max_connections),
        },
    )


def server_config(app: ASGIApp, limits: Limits, *, graceful_seconds: int) -> uvicorn.Config:
    """uvicorn as every server of ours runs it: our protocol (deadlines and caps), no
    websockets, lifespan or logging of its own, no proxy headers (nothing here reads the
    client's address), no Server header, keep-alive as the limits say."""
    return uvicorn.Config(
        app,
        http=protocol_class(limits),
        ws="none",
        lifespan="off",
        interface="asgi3",
        loop="asyncio",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=limits.idle_seconds,
        timeout_graceful_shutdown=graceful_seconds,
        h11_max_incomplete_event_size=MAX_HEADERS,
    )


class SlackEvents:
    """The ASGI app: `POST /slack/events` into Bolt, `GET /healthz`, `/livez`, `/metrics`,
    and `GET /oauth/callback` (per-user connections). With no `app` (Socket Mode), the
    callback alone."""

    def __init__(
        self, app: App | None, rt: Runtime, secrets: Sequence[str], limits: Limits
    ) -> None:
        self.app = app
        self.rt = rt
        self.secrets = tuple(secrets)
        self.limits = limits
        self.dispatcher = ThreadPoolExecutor(limits.dispatch_threads, thread_name_prefix="http")
        self.probes = ThreadPoolExecutor(2, thread_name_prefix="http-probe")
        self.waiting = 0  # requests dispatched or waiting for a thread (event loop only)
        self.probing = 0
        self.buffered = 0  # bytes of bodies being read now (event loop only)
        self.busy = Tally("http_dispatch_busy", dispatch_queue=limits.dispatch_queue)
        self.full = Tally("http_body_budget_full", body_budget=limits.body_budget)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self.route(scope, receive, send)
        except Exception:  # boundary: one request's bug is a 500 and a traceback, in our log
            log.exception("http_request_failed", path=str(scope.get("path"))[:80])
            with contextlib.suppress(RuntimeError):  # an answer was begun: uvicorn closes
                await respond(send, 500, {"error": "internal error"}, close=True)

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > MAX_HEADERS:
            # h11 refuses incomplete headers past MAX_HEADERS; whole ones that came in one
            # read (up to 256 kB) reach here
            await respond(send, 431, {"error": "headers too large"}, close=True)
            return
        if method == "GET" and path == oauth_callback.CALLBACK_PATH:
            await self.oauth_callback(scope, send)
        elif self.app is None:  # Socket Mode's port: the callback alone
            await respond(send, 404, {"error": "not found"})
        elif method == "POST" and path == EVENTS_PATH:
            await self.event(scope, receive, send)
        elif method in ("GET", "HEAD") and path == LIVE_PATH:
            await respond(send, 200, {"ok": True})
        elif method in ("GET", "HEAD") and path in (HEALTH_PATH, metrics.METRICS_PATH):
            await self.probe(path, send)
        else:
            await respond(send, 404, {"error": "not found"})

    async def probe(self, path: str, send: Send) -> None:
        """Readiness and metrics ask Redis: off the event loop, a few at a time."""
        if self.probing >= 8:
            await respond(send, 503, {"error": "busy"}, {"Retry-After": "1"})
            return
        self.probing += 1
        try:
            loop = asyncio.get_running_loop()
            if path == HEALTH_PATH:
                status, body = await loop.run_in_executor(self.probes, self.health)
                await respond(send, status, body)
            else:
                exposition, content_type = await loop.run_in_executor(
                    self.probes, metrics.render, self.rt
                )
                await respond(send, 200, exposition.decode(), {"Content-Type": content_type})
        finally:
            self.probing -= 1

    async def oauth_callback(self, scope: Scope, send: Send) -> None:
        """A provider sent a person back (bot/transport/oauth_callback.py): off the event
        loop, since finishing asks Redis and the provider's token endpoint."""
        if self.waiting >= self.limits.dispatch_threads + self.limits.dispatch_queue:
            await respond(send, 503, {"error": "busy"}, {"Retry-After": "1"})
            return
        query = scope["query_string"].decode("latin-1")
        self.waiting += 1
        try:
            status, html_page = await asyncio.get_running_loop().run_in_executor(
                self.dispatcher, oauth_callback.callback_page, self.rt, query
            )
        finally:
            self.waiting -= 1
        await respond(send, status, html_page, oauth_callback.HEADERS)

    def health(self) -> tuple[int, dict[str, Any]]:
        try:
            self.rt.redis.ping()
        except redis.RedisError as exc:
            return 503, {"ok": False, "error": f"redis: {type(exc).__name__}"}
        return 200, {"ok": True}

    async def event(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers = header_lists(scope["headers"])
        declared = (headers.get("content-length") or [""])[0]
        if declared and not (declared.isascii() and declared.isdigit()):
            await respond(send, 400, {"error": "bad Content-Length"}, close=True)
            return
        if declared and int(declared) > self.limits.max_body:
            await respond(send, 413, {"error": "request too large"}, close=True)
            return
        raw = await self.read_body(receive)
        if raw is None:  # the client went away (or the deadline closed it)
            return
        if isinstance(raw, int):
            await respond(
                send,
                raw,
                {"error": "request too large" if raw == 413 else "busy"},
                {"Retry-After": "1"} if raw == 503 else None,
                close=True,
            )
            return
        unsigned = signature.problem(
            self.secrets,
            headers.get("x-slack-request-timestamp", []),
            headers.get("x-slack-signature", []),
            raw,
        )
        if unsigned:  # before anything reads the body: nobody else's bytes get parsed
            log.warning("request_unsigned", problem=unsigned, size=len(raw))
            await respond(send, 401, {"error": "invalid signature"})
            return
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("request_malformed", problem="not UTF-8", size=len(raw))
            await respond(send, 400, {"error": "malformed request"})
            return
        content_type = (headers.get("content-type") or [""])[0].split(";")[0] or None
        payload = envelope.parse(body, content_type)
        found = "not a JSON object or form" if payload is None else envelope.problem(payload)
        if found:
            log.warning("request_malformed", problem=found, size=len(raw))
            await respond(send, 400, {"error": "malformed request"})
            return
        if self.waiting >= self.limits.dispatch_threads + self.limits.dispatch_queue:
            self.busy.add()
            await respond(send, 503, {"error": "busy"}, {"Retry-After": "1"})
            return
        query = scope["query_string"].decode("latin-1")
        self.waiting += 1
        try:
            response = await asyncio.get_running_loop().run_in_executor(
                self.dispatcher, self.dispatch, body, query, headers
            )
        finally:
            self.waiting -= 1
        if response is None:
            await respond(send, 400, {"error": "malformed request"})
            return
        await respond(send, response.status, response.body, response.headers)
        metrics.observe_ack(time.perf_counter() - started)

    async def read_body(self, receive: Receive) -> bytes | int | None:
        """The body; 413 past `max_body`, 503 when all bodies being read together would pass
        `body_budget`; None when the client left first."""
        chunks = bytearray()
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                if len(chunks) + len(chunk) > self.limits.max_body:
                    return 413
                if self.buffered + len(chunk) > self.limits.body_budget:
                    self.full.add()
                    return 503
                chunks += chunk
                self.buffered += len(chunk)
                if not message.get("more_body", False):
                    return bytes(chunks)
        finally:
            self.buffered -= len(chunks)

    def dispatch(self, body: str, query: str, headers: dict[str, list[str]]) -> BoltResponse | None:
        """Bolt's dispatch (on a dispatch thread); None for a shape `envelope` missed."""
        assert self.app is not None  # `route` sends events only where there is an app
        try:
            request = BoltRequest(body=body, query=query, headers=dict(headers.items()))
        except Exception:  # boundary: a shape `envelope` missed; answer rather than hang up
            log.exception("request_unreadable", size=len(body))
            return None
        with tracing.slack_request(request_kind(request.body)):
            return self.app.dispatch(request)

    def close(self) -> None:
        self.dispatcher.shutdown(wait=False, cancel_futures=True)
        self.probes.shutdown(wait=False, cancel_futures=True)


def header_lists(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, list[str]]:
    """Every value of every header, by lower-case name (a header sent twice is seen)."""
    found: dict[str, list[str]] = {}
    for name, value in raw:
        found.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return found


async def respond(
    send: Send,
    status: int,
    body: Any,
    headers: dict[str, Any] | None = None,
    *,
    close: bool = False,
) -> None:
    """A whole answer: a dict body as JSON, a string as text (unless `headers` say what)."""
    data = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
    content_type = "text/plain" if isinstance(body, str) else "application/json"
    out: list[tuple[bytes, bytes]] = []
    for key, values in (headers or {}).items():
        if key.lower() in ("content-length", "connection"):
            continue
        if key.lower() == "content-type":
            content_type = values[0] if isinstance(values, list | tuple) else str(values)
            continue
        for value in values if isinstance(values, list | tuple) else [values]:
            out.append((key.lower().encode("latin-1"), str(value).encode("latin-1")))
    out += [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())]
    if close:
        out.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data})


class SlackHTTPServer:
    """The server for `App` (None: the OAuth callback alone, `callback_server`): bound at
    construction (so `port` is known at once), run by `serve_forever` in the calling
    thread, stopped from any thread by `shutdown`."""

    def __init__(
        self,
        app: App | None,
        rt: Runtime,
        address: tuple[str, int],
        *,
        signing_secret: str | Sequence[str] = (),
        max_connections: int | None = None,
        request_seconds: float = Limits.request_seconds,
        limits: Limits | None = None,
    ) -> None:
        secrets = (signing_secret,) if isinstance(signing_secret, str) else tuple(signing_secret)
        if app is not None and not any(secrets):
            raise ValueError("the HTTP server needs the signing secret to verify Slack's requests")
        self.rt = rt
        self.limits = limits or Limits(
            request_seconds=request_seconds,
            idle_seconds=max(1, min(Limits.idle_seconds, int(request_seconds))),
            max_connections=max_connections or default_max_connections(),
        )
        self.events = SlackEvents(app, rt, [s for s in secrets if s], self.limits)
        self.socket = socket.create_server(address, backlog=1024)
        self.socket.setblocking(False)
        self.config = server_config(self.events, self.limits, graceful_seconds=5)
        self.server = uvicorn.Server(self.config)
        self._running = threading.Event()
        self._stopped = threading.Event()

    @property
    def app(self) -> App:
        """The Bolt app it serves (not the callback server's: it has none)."""
        if self.events.app is None:
            raise AttributeError("the OAuth callback server serves no Bolt app")
        return self.events.app

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self.server.server_state.connections)

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        """Serve until `shutdown` (or SIGINT/SIGTERM, in the main thread: uvicorn answers
        what is in flight, then raises the signal again for the caller)."""
        del poll_interval  # uvicorn checks for a stop every 0.1 s
        self._running.set()
        try:
            if not self.server.should_exit:  # `shutdown` came first: never start
                self.server.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait for it (it answers what is in flight first)."""
        self.server.should_exit = True
        if self._running.is_set():
            self._stopped.wait(10)

    def server_close(self) -> None:
        self.events.close()
        with contextlib.suppress(OSError):
            self.socket.close()


def callback_server(rt: Runtime, address: tuple[str, int]) -> SlackHTTPServer:
    """Socket Mode's HTTP server: `GET /oauth/callback` and nothing else, with the same
    deadline, caps and thread pool as HTTP mode."""
    return SlackHTTPServer(None, rt, address)
