"""Running the Slack bot: the Bolt app, served over Socket Mode or HTTP (`/slack/events`).

In HTTP mode the server checks Slack's signature on the raw body before it reads anything
(`bot.signature`; 401 otherwise), then the envelope (`bot.envelope`; 400), and Bolt checks
the signature again (its RequestVerification stays on). Socket Mode needs neither, as the
connection itself is authenticated with the app-level token. The server holds at most
`max_connections` connections (one thread each); past that it answers 503 at once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

import redis
import structlog
from slack_bolt import App, BoltRequest
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_bolt.error import BoltError
from slack_sdk import WebClient
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest

from bot import envelope, signature
from bot.identity import GROUPS_TTL, Identity, user_groups
from bot.installations import Home, Installations
from bot.listeners import Bot, register
from bot.surface import SlackSurface, with_rate_limit_retries
from bot.threads import Threads
from worker import metrics
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
MAX_BODY = 1_000_000  # Slack's payloads are far smaller; a bigger body is not from Slack
LISTENER_THREADS = 8
MAX_CONNECTIONS = 64  # open connections (= handler threads); Slack needs an ack within 3 s
IDLE_SECONDS = 10.0  # an idle keep-alive connection, or a body that stops arriving, is closed
BUSY_LOG_EVERY = 10.0  # seconds between two `http_busy` warnings while connections are refused
START_HINT = "check SLACK_BOT_TOKEN (xoxb-...) and SLACK_API_URL"


def build_app(
    rt: Runtime,
    *,
    bot_token: str,
    signing_secret: str,
    api_url: str,
    groups_ttl: float = GROUPS_TTL,
    listener_threads: int = LISTENER_THREADS,
    allowed_teams: Collection[str] = (),
    allowed_apps: Collection[str] = (),
) -> App:
    """The Bolt app with Switchboard's listeners. Calls `auth.test` once (Bolt does) and
    once more to learn which workspace and app it serves (`bot.installations.Home`);
    `allowed_teams`/`allowed_apps` add workspaces (or Enterprise Grid orgs) and apps whose
    requests are served too."""
    client = with_rate_limit_retries(WebClient(token=bot_token, base_url=api_url))
    app = App(
        name="switchboard",
        client=client,
        signing_secret=signing_secret,
        listener_executor=ThreadPoolExecutor(listener_threads, thread_name_prefix="listener"),
    )
    home = Home.learn(client, teams=allowed_teams, apps=allowed_apps)
    installations = Installations(rt.redis, rt.settings.namespace, rt.settings.retention)
    for team in home.own_teams:  # the token works, so the app is installed there (again)
        installations.restore(team)
    existing = rt.surfaces.get("slack")
    surface = existing if isinstance(existing, SlackSurface) else SlackSurface(client, rt)
    sb = Bot(
        rt=rt,
        identity=Identity(rt.policy, user_groups(rt, client, groups_ttl), home),
        threads=Threads(rt.redis, rt.settings.namespace, rt.settings.retention),
        surface=surface,
        home=home,
        installations=installations,
    )
    rt.policy_listeners.append(sb.identity.use)  # a reloaded policy: its roles at once
    if rt.roles is None:  # this process runs workers too (`switchboard dev`, tests)
        rt.roles = sb.identity.current_roles
    register(app, sb)
    return app


def serve(
    rt: Runtime,
    *,
    bot_token: str,
    app_token: str,
    signing_secret: str,
    api_url: str,
    http: bool,
    port: int,
    allowed_teams: Collection[str] = (),
    allowed_apps: Collection[str] = (),
) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit status."""
    if http and not signing_secret:
        raise ValueError("HTTP mode needs SLACK_SIGNING_SECRET to verify Slack's requests")
    if not http and not app_token:
        raise ValueError("Socket Mode needs SLACK_APP_TOKEN (an xapp- app-level token)")
    try:
        app = build_app(
            rt,
            bot_token=bot_token,
            signing_secret=signing_secret,
            api_url=api_url,
            allowed_teams=allowed_teams,
            allowed_apps=allowed_apps,
        )
    except BoltError as exc:  # Bolt checks the token with auth.test at start-up
        log.error("slack_start_failed", error=str(exc)[:300], hint=START_HINT)
        return 2
    stop_on_sigterm()
    watch_policy(rt)
    if http:
        server = SlackHTTPServer(app, rt, ("0.0.0.0", port), signing_secret=signing_secret)
        log.info("bot_started", mode="http", port=server.port, path=EVENTS_PATH)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("bot_stopping")
        finally:
            server.server_close()
        return 0
    handler = TimedSocketModeHandler(app, app_token)
    log.info("bot_started", mode="socket")
    try:
        handler.start()
    except KeyboardInterrupt:
        log.info("bot_stopping")
    finally:
        handler.close()
    return 0


def watch_policy(rt: Runtime) -> None:
    """Pick up a changed policy file while serving (every few seconds, and on SIGHUP)."""
    if rt.policy_watcher is None:
        return
    rt.policy_watcher.start()
    if threading.current_thread() is threading.main_thread():
        watcher = rt.policy_watcher
        signal.signal(signal.SIGHUP, lambda _signum, _frame: watcher.wake())


def stop_on_sigterm() -> None:
    """SIGTERM (the supervisor, Docker, Kubernetes) stops the bot like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


class SlackHTTPServer(ThreadingHTTPServer):
    """`POST /slack/events` into Bolt's `dispatch`; `GET /healthz` checks Redis.

    One thread per connection, at most `max_connections` at once: a connection past that
    gets a 503 (Slack retries events later) instead of another thread. A client that goes
    away mid-request is logged in one quiet line, not with a traceback."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # listen() backlog: a burst must not drop connections

    def __init__(
        self,
        app: App,
        rt: Runtime,
        address: tuple[str, int],
        *,
        signing_secret: str,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not signing_secret:
            raise ValueError("the HTTP server needs the signing secret to verify Slack's requests")
        self.app = app
        self.rt = rt
        self.signing_secret = signing_secret
        self.max_connections = max_connections
        self.slots = threading.BoundedSemaphore(max_connections)
        self._busy = 0  # connections refused since the last `http_busy` warning
        self._busy_logged = float("-inf")
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refuse_busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its slot is free again
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def refuse_busy(self, request: socket.socket) -> None:
        """Answer 503 without a thread (a small write the socket buffer takes at once)."""
        self._busy += 1
        now = time.monotonic()
        if now - self._busy_logged >= BUSY_LOG_EVERY:
            log.warning("http_busy", refused=self._busy, max_connections=self.max_connections)
            self._busy, self._busy_logged = 0, now
        with contextlib.suppress(OSError):  # it went away already: nothing to answer
            request.settimeout(0.5)
            request.sendall(BUSY_RESPONSE)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback to stderr; a client that hung up is not an error."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # reset, broken pipe, timeout, TLS cut short
            log.info("http_connection_aborted", error=type(error).__name__)
            return
        log.exception("http_request_failed")


class TimedSocketModeHandler(SocketModeHandler):
    """Bolt's Socket Mode handler, timing each request from arrival to its acknowledgement."""

    def handle(self, client: SocketModeClient, req: SocketModeRequest) -> None:  # type: ignore[override]
        started = time.perf_counter()
        super().handle(client, req)
        metrics.observe_ack(time.perf_counter() - started)


BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 17\r\nConnection: close\r\n\r\n{"error": "busy"}'
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS  # an idle connection, or a body that never arrives, frees its thread
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall on small responses
    server: SlackHTTPServer

    def do_POST(self) -> None:
        started = time.perf_counter()
        path, _, query = self.path.partition("?")
        if path != EVENTS_PATH:
            self._send(404, {"error": "not found"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return
        if length > MAX_BODY:
            self.close_connection = True
            self._send(413, {"error": "request too large"})
            return
        try:
            raw = self.rfile.read(length)
        except OSError:  # the client went away, or sent less than it announced (timeout)
            self.close_connection = True
            return
        unsigned = signature.problem(
            self.server.signing_secret,
            self.headers.get_all("X-Slack-Request-Timestamp") or [],
            self.headers.get_all("X-Slack-Signature") or [],
            raw,
        )
        if unsigned:  # before anything reads the body: nobody else's bytes get parsed
            log.warning("request_unsigned", problem=unsigned, size=length)
            self._send(401, {"error": "invalid signature"})
            return
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("request_malformed", problem="not UTF-8", size=length)
            self._send(400, {"error": "malformed request"})
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0] or None
        payload = envelope.parse(body, content_type)
        found = "not a JSON object or form" if payload is None else envelope.problem(payload)
        if found:
            log.warning("request_malformed", problem=found, size=length)
            self._send(400, {"error": "malformed request"})
            return
        listed: dict[str, list[str]] = {}
        for key, value in self.headers.items():
            listed.setdefault(key.lower(), []).append(value)
        headers: dict[str, str | Sequence[str]] = dict(listed.items())
        try:
            request = BoltRequest(body=body, query=query, headers=headers)
        except Exception:  # boundary: a shape `envelope` missed; answer rather than hang up
            log.exception("request_unreadable", size=length)
            self._send(400, {"error": "malformed request"})
            return
        response = self.server.app.dispatch(request)
        self._send(response.status, response.body, response.headers)
        metrics.observe_ack(time.perf_counter() - started)

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == metrics.METRICS_PATH:
            body, content_type = metrics.render(self.server.rt)
            self._send(200, body.decode(), {"Content-Type": content_type})
            return
        if path != HEALTH_PATH:
            self._send(404, {"error": "not found"})
            return
        try:
            self.server.rt.redis.ping()
        except redis.RedisError as exc:
            self._send(503, {"ok": False, "error": f"redis: {type(exc).__name__}"})
            return
        self._send(200, {"ok": True})

    def _send(self, status: int, body: Any, headers: dict[str, Any] | None = None) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
        self.send_response(status)
        content_type = "application/json" if not isinstance(body, str) else "text/plain"
        for key, values in (headers or {}).items():
            if key.lower() == "content-length":
                continue
            if key.lower() == "content-type":
                content_type = values[0] if isinstance(values, list | tuple) else str(values)
                continue
            for value in values if isinstance(values, list | tuple) else [values]:
                self.send_header(key, str(value))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return
