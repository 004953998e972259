"""Running the Slack bot: the Bolt app, served over Socket Mode or HTTP (`/slack/events`).

In HTTP mode the server (`bot.transport.http_server`: uvicorn, with a whole-request deadline) checks
Slack's signature on the raw body before it reads anything (`bot.transport.signature`; 401
otherwise), then the envelope (`bot.transport.envelope`; 400), and Bolt checks the signature again
(`bot.transport.verification`, with every configured signing secret). Socket Mode needs neither, as
the connection itself is authenticated with the app-level token. With per-user connections
set up, Socket Mode still opens `port` for people's browsers: `GET /oauth/callback` alone
(`serve_callback`), where SWITCHBOARD_PUBLIC_URL must reach it.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable, Collection, Sequence
from types import FrameType

import redis
import structlog
from slack_bolt import App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_bolt.error import BoltError
from slack_sdk import WebClient
from slack_sdk.socket_mode.builtin import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest

from bot.listeners import Bot, register
from bot.outbound.slack_surface import SlackSurface, with_rate_limit_retries
from bot.state.identity import GROUPS_TTL, Identity, user_groups
from bot.state.installations import Home, Installations
from bot.state.threads import Threads
from bot.transport.http_server import EVENTS_PATH, SlackHTTPServer, callback_server
from bot.transport.oauth_callback import CALLBACK_PATH
from bot.transport.payloads import request_kind
from bot.transport.verification import SigningSecrets
from tools.exceptions import OperatorError
from worker import metrics, tracing
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

LISTENER_THREADS = 8
START_HINT = "check SLACK_BOT_TOKEN (xoxb-...) and SLACK_API_URL"


class CallbackPortError(OperatorError):
    """Socket Mode cannot open the port for /oauth/callback (taken, or not ours to open)."""


def build_app(
    rt: Runtime,
    *,
    bot_token: str,
    signing_secret: str | Sequence[str],
    api_url: str,
    groups_ttl: float = GROUPS_TTL,
    listener_threads: int = LISTENER_THREADS,
    allowed_teams: Collection[str] = (),
    allowed_apps: Collection[str] = (),
) -> App:
    """The Bolt app with Switchboard's listeners. Calls `auth.test` once (Bolt does) and
    once more to learn which workspace and app it serves (`bot.state.installations.Home`);
    `allowed_teams`/`allowed_apps` add workspaces (or Enterprise Grid orgs) and apps whose
    requests are served too."""
    client = with_rate_limit_retries(WebClient(token=bot_token, base_url=api_url))
    secrets = SigningSecrets.of(signing_secret)
    app = App(
        name="switchboard",
        client=client,
        signing_secret=secrets.current,
        # Bolt's own check knows one secret: ours (below) knows every configured one
        request_verification_enabled=False,
        # listeners run after the ack, in the context of the request (its span, its log context)
        listener_executor=tracing.ContextPool(listener_threads, thread_name_prefix="listener"),
    )
    app.use(secrets.middleware())
    home = Home.learn(client, teams=allowed_teams, apps=allowed_apps)
    installations = Installations(rt.redis, rt.settings.namespace, rt.settings.retention)
    for team in home.own_teams:  # the token works, so the app is installed there (again)
        restore = functools.partial(installations.restore, team)
        patiently(restore, "restore_installation", rt.settings.redis_start_wait)
    existing = rt.surfaces.get("slack")
    surface = existing if isinstance(existing, SlackSurface) else SlackSurface(client, rt)
    sb = Bot(
        rt=rt,
        identity=Identity(rt, user_groups(rt, client, groups_ttl), home),
        threads=Threads(rt.redis, rt.settings.namespace, rt.settings.retention),
        surface=surface,
        home=home,
        installations=installations,
    )
    if rt.roles is None:  # this process runs workers too (`switchboard dev`, tests)
        rt.roles = sb.identity.current_roles
    register(app, sb)
    return app


def patiently(write: Callable[[], object], what: str, wait: float) -> None:
    """An idempotent start-up write, sent again while Redis does not answer (a restart or a
    failover as the bot starts), for up to `wait` seconds (SWITCHBOARD_REDIS_START_WAIT).
    Exiting instead left the one process people talk to down until something restarted it
    (found by the chaos soak: a bot killed during a Redis restart did not come back)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            write()
            return
        except redis.AuthenticationError:
            raise  # a refused password: no wait mends it
        except (redis.ConnectionError, redis.TimeoutError) as error:
            if time.monotonic() > deadline:
                raise
            log.warning("redis_unavailable_at_start", step=what, error=type(error).__name__)
            time.sleep(0.5)


def serve(
    rt: Runtime,
    *,
    bot_token: str,
    app_token: str,
    signing_secret: str | Sequence[str],
    api_url: str,
    http: bool,
    port: int,
    allowed_teams: Collection[str] = (),
    allowed_apps: Collection[str] = (),
) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit status."""
    if http and not SigningSecrets.of(signing_secret).current:
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
    callback = serve_callback(rt, ("0.0.0.0", port))
    handler = TimedSocketModeHandler(app, app_token)
    log.info("bot_started", mode="socket")
    try:
        handler.start()
    except KeyboardInterrupt:
        log.info("bot_stopping")
    finally:
        handler.close()
        if callback is not None:
            callback.shutdown()
            callback.server_close()
    return 0


def serve_callback(rt: Runtime, address: tuple[str, int]) -> SlackHTTPServer | None:
    """Socket Mode with per-user connections: the provider sends people's browsers back to
    SWITCHBOARD_PUBLIC_URL/oauth/callback, so that path (and no other) is served on
    `address`, in a thread, until `shutdown`. None when connections are not set up."""
    if rt.connections is None:
        return None
    try:
        server = callback_server(rt, address)
    except OSError as exc:
        raise CallbackPortError(
            f"cannot serve {CALLBACK_PATH} on port {address[1]}: {exc.strerror or exc}; "
            "choose another --port (SWITCHBOARD_PUBLIC_URL must reach it)"
        ) from exc
    threading.Thread(target=server.serve_forever, name="oauth-callback", daemon=True).start()
    log.info("oauth_callback_serving", port=server.port, path=CALLBACK_PATH)
    return server


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


class TimedSocketModeHandler(SocketModeHandler):
    """Bolt's Socket Mode handler, timing each request from arrival to its acknowledgement."""

    def handle(self, client: SocketModeClient, req: SocketModeRequest) -> None:  # type: ignore[override]
        started = time.perf_counter()
        with tracing.slack_request(request_kind(req.payload)):
            super().handle(client, req)
        metrics.observe_ack(time.perf_counter() - started)
