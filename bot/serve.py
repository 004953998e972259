"""Running the Slack bot: the Bolt app, served over Socket Mode or HTTP (`/slack/events`).

Slack's signature check is always on in HTTP mode (Bolt's RequestVerification); Socket Mode
needs none, as the connection itself is authenticated with the app-level token.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Sequence
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

from bot import envelope
from bot.identity import GROUPS_TTL, Identity, UserGroups
from bot.listeners import Bot, register
from bot.surface import SlackSurface, with_rate_limit_retries
from bot.threads import Threads
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
MAX_BODY = 1_000_000  # Slack's payloads are far smaller; a bigger body is not from Slack
LISTENER_THREADS = 8
START_HINT = "check SLACK_BOT_TOKEN (xoxb-...) and SLACK_API_URL"


def build_app(
    rt: Runtime,
    *,
    bot_token: str,
    signing_secret: str,
    api_url: str,
    groups_ttl: float = GROUPS_TTL,
    listener_threads: int = LISTENER_THREADS,
) -> App:
    """The Bolt app with Switchboard's listeners. Calls `auth.test` once (Bolt does)."""
    client = with_rate_limit_retries(WebClient(token=bot_token, base_url=api_url))
    app = App(
        name="switchboard",
        client=client,
        signing_secret=signing_secret,
        listener_executor=ThreadPoolExecutor(listener_threads, thread_name_prefix="listener"),
    )
    existing = rt.surfaces.get("slack")
    surface = existing if isinstance(existing, SlackSurface) else SlackSurface(client, rt)
    sb = Bot(
        rt=rt,
        identity=Identity(rt.policy, UserGroups(client, ttl=groups_ttl)),
        threads=Threads(rt.redis, rt.settings.namespace, rt.settings.retention),
        surface=surface,
    )
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
) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit status."""
    if http and not signing_secret:
        raise ValueError("HTTP mode needs SLACK_SIGNING_SECRET to verify Slack's requests")
    if not http and not app_token:
        raise ValueError("Socket Mode needs SLACK_APP_TOKEN (an xapp- app-level token)")
    try:
        app = build_app(rt, bot_token=bot_token, signing_secret=signing_secret, api_url=api_url)
    except BoltError as exc:  # Bolt checks the token with auth.test at start-up
        log.error("slack_start_failed", error=str(exc)[:300], hint=START_HINT)
        return 2
    stop_on_sigterm()
    if http:
        server = SlackHTTPServer(app, rt, ("0.0.0.0", port))
        log.info("bot_started", mode="http", port=server.port, path=EVENTS_PATH)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("bot_stopping")
        finally:
            server.server_close()
        return 0
    handler = SocketModeHandler(app, app_token)
    log.info("bot_started", mode="socket")
    try:
        handler.start()
    except KeyboardInterrupt:
        log.info("bot_stopping")
    finally:
        handler.close()
    return 0


def stop_on_sigterm() -> None:
    """SIGTERM (the supervisor, Docker, Kubernetes) stops the bot like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


class SlackHTTPServer(ThreadingHTTPServer):
    """`POST /slack/events` into Bolt's `dispatch`; `GET /healthz` checks Redis."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: App, rt: Runtime, address: tuple[str, int]) -> None:
        self.app = app
        self.rt = rt
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60.0  # a client that announces a body and never sends it frees its thread
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall on small responses
    server: SlackHTTPServer

    def do_POST(self) -> None:
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
            body = self.rfile.read(length).decode("utf-8", "replace")
        except OSError:  # the client went away, or sent less than it announced (timeout)
            self.close_connection = True
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

    def do_GET(self) -> None:
        if self.path.partition("?")[0] != HEALTH_PATH:
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
