"""The long-running verbs: `dev` (everything in one process tree), `bot`, `worker` and
`chat` (the terminal console)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from switchboard import errors, logs
from switchboard.console import Console, WorkerGuard
from switchboard.redisconn import url_of
from switchboard.settings import Config, data_dir
from switchboard.supervise import STOP_SIGNALS, Supervisor
from switchboard.verbs import help_of
from switchboard.wiring import open_runtime
from worker.runtime import Runtime


def _verb(verbs: Any, name: str, handler: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = verbs.add_parser(
        name, help=help_of(name), description=help_of(name)
    )
    p.set_defaults(handler=handler, log_level=logging.INFO)
    return p


def add_dev(verbs: Any) -> None:
    p = _verb(verbs, "dev", cmd_dev)
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")


def add_bot(verbs: Any) -> None:
    p = _verb(verbs, "bot", cmd_bot)
    p.set_defaults(service=True)  # waits at start for Redis (SWITCHBOARD_REDIS_START_WAIT)
    p.add_argument("--http", action="store_true", help="serve /slack/events over HTTP")
    p.add_argument(
        "--port",
        type=int,
        default=3000,
        help="HTTP port (default 3000); in Socket Mode with per-user connections it serves "
        "/oauth/callback alone",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve /metrics, /healthz and /livez on port N (HTTP mode also serves /metrics "
        "on --port)",
    )


def add_worker(verbs: Any) -> None:
    p = _verb(verbs, "worker", cmd_worker)
    p.set_defaults(service=True)
    p.add_argument("--processes", type=positive, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--concurrency",
        type=positive,
        metavar="N",
        help="runs each process carries at once (default SWITCHBOARD_WORKER_CONCURRENCY, 128)",
    )
    p.add_argument(
        "--pool",
        choices=("gevent", "threads"),
        help="what each process carries its runs in: greenlets on one event loop, or OS "
        "threads for tools that block outside Python's sockets (default "
        "SWITCHBOARD_WORKER_POOL; unset: gevent, threads for --concurrency 1)",
    )
    p.add_argument("--burst", action="store_true", help="stop when the queue is empty")
    p.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, how long runs in flight get to reach their next step and go back to "
        "the queue (default SWITCHBOARD_STOP_GRACE_SECONDS, 25)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve /metrics, /healthz and /livez on port N (with --processes P: N to N+P-1)",
    )


def add_chat(verbs: Any) -> None:
    p = _verb(verbs, "chat", cmd_chat)
    p.add_argument("--user", help="the Slack user id to act as (default console:$USER)")
    p.set_defaults(log_level=logging.ERROR)  # nothing but the conversation on the terminal


def child_env(rt: Runtime, config: Config) -> dict[str, str]:
    """Children reach the same Redis; an embedded server is shared through its socket. It
    runs already, and nobody restarts it: a child that cannot reach it says so at once, as
    a configuration error (exit status 2 stops them all), not after a wait and again at
    every restart."""
    if config.redis_url:
        return {}
    return {"REDIS_URL": url_of(rt.redis), "SWITCHBOARD_REDIS_START_WAIT": "0"}


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"expected 1 to 1000, got {value}")
    return value


def cmd_worker(config: Config, args: argparse.Namespace) -> int:
    if args.concurrency:
        config.worker_concurrency = args.concurrency
    rt = open_runtime(config, service=True)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    grace = args.grace if args.grace is not None else config.stop_grace_seconds
    if args.processes <= 1:
        from switchboard.startup import check_model, load_connections_sdk
        from worker.process import serve

        check_model(rt)  # warns when the model server cannot be reached; never stops start-up
        load_connections_sdk(rt)
        if args.metrics_port:
            from worker import metrics

            metrics.serve(args.metrics_port, rt)
        serve(rt, burst=args.burst, grace=grace)
        return 0
    from switchboard.supervise import Supervisor

    child = ["worker", "--concurrency", str(config.worker_concurrency), "--grace", str(grace)]
    pool = args.pool or config.worker_pool
    child += ["--pool", pool] if pool else []  # else each child's own default
    supervisor = Supervisor(child_env(rt, config))
    with supervisor.signals():  # before the children start: a Ctrl-C meanwhile stops them
        for n in range(args.processes):
            port = ["--metrics-port", str(args.metrics_port + n)] if args.metrics_port else []
            burst = ["--burst"] if args.burst else []
            supervisor.start(f"worker-{n + 1}", [*child, *port, *burst])
        return supervisor.watch(restart=not args.burst)


def cmd_chat(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    guard = WorkerGuard(rt, child_env(rt, config), log_dir=_log_dir(args))
    return _console(Console(rt, user_id=args.user, workers=guard), guard)


def _console(console: Console, guard: WorkerGuard) -> int:
    """Run the console; a hang-up or SIGTERM ends it as Ctrl-C does, and its workers stop."""
    if console.rt.policy_watcher is not None:  # decisions at the prompt: the live policy
        console.rt.policy_watcher.start()
    signals = _Interrupts(guard.supervisor)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signals)
    code = 130
    try:
        code = console.loop()
    finally:
        while True:  # a signal may land before `ending` is set: then set it again
            try:
                signals.ending = True
                guard.stop(announce=code != 0)
                break
            except KeyboardInterrupt:
                continue
    return code


class _Interrupts:
    """SIGINT, SIGHUP, SIGTERM end the console (KeyboardInterrupt). Once it is ending they
    only hurry the stop: a closed terminal sends SIGHUP more than once, and an exception
    then would leave the workers and, as its last user, the embedded Redis running."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.ending = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        if self.ending:
            self.supervisor.hurry = True
            return
        raise KeyboardInterrupt


def _log_dir(args: argparse.Namespace) -> Path | None:
    """Where the console's workers write their logs; None (the terminal) with --verbose."""
    return None if args.verbose else data_dir() / "logs"


def cmd_bot(config: Config, args: argparse.Namespace) -> int:
    check_slack(config, http=args.http)
    from slack_sdk.errors import SlackApiError

    from bot.transport.serve import serve

    logs.drop_reported(_WSS_FAILURE)  # said below, in one line
    logs.drop_reported(_BOLT_TOKEN_NOTE)  # Bolt sees SLACK_BOT_TOKEN set; we pass the client
    rt = open_runtime(config, service=True)
    from switchboard.startup import load_connections_sdk

    # The model server is not asked here: the bot never calls it (every worker asks at its
    # start), and asking would load the openai SDK into the bot (~19 MiB) for one request.
    load_connections_sdk(rt)
    if args.metrics_port:
        from worker import metrics

        metrics.serve(args.metrics_port, rt)
    try:
        return serve(
            rt,
            bot_token=config.slack_bot_token,
            app_token=config.slack_app_token,
            signing_secret=config.signing_secrets,
            api_url=config.slack_api_url,
            http=args.http,
            port=args.port,
            allowed_teams=config.allowed_teams,
            allowed_apps=config.allowed_apps,
        )
    except SlackApiError as exc:  # Socket Mode could not open its connection
        method = str(getattr(exc.response, "api_url", "")).rsplit("/", 1)[-1]
        name = "SLACK_APP_TOKEN" if method == "apps.connections.open" else "SLACK_BOT_TOKEN"
        raise errors.slack_rejected(name, str(exc.response.get("error", exc))) from exc


_WSS_FAILURE = "Failed to retrieve WSS URL"
_BOLT_TOKEN_NOTE = "As you gave `client` as well"


def check_slack(config: Config, *, http: bool) -> None:
    """The tokens are there, look like the right kind, and Slack accepts the bot token
    (`auth.test`). The app-level token is tried by the bot when it connects (Slack allows
    about one `apps.connections.open` a minute, so it is not spent on a check)."""
    missing = _missing_slack(config, http=http)
    if missing:
        raise errors.slack_missing(missing)
    needed = ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET" if http else "SLACK_APP_TOKEN"]
    placeholders = config.placeholders(*needed)
    if placeholders:  # before asking Slack, which would answer invalid_auth, or not at all
        raise errors.example_placeholder(placeholders)
    bot_token = config.slack_bot_token
    if not bot_token.startswith(("xoxb-", "xoxe.xoxb-")):
        raise errors.slack_token_shape("SLACK_BOT_TOKEN", "xoxb-", bot_token)
    if not http and not config.slack_app_token.startswith("xapp-"):
        raise errors.slack_token_shape("SLACK_APP_TOKEN", "xapp-", config.slack_app_token)
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError, SlackClientError

    try:
        WebClient(token=bot_token, base_url=config.slack_api_url, timeout=15).auth_test()
    except SlackApiError as exc:
        raise errors.slack_rejected("SLACK_BOT_TOKEN", str(exc.response.get("error"))) from exc
    except (SlackClientError, OSError) as exc:
        raise errors.slack_unreachable(config.slack_api_url, str(exc)) from exc


def cmd_dev(config: Config, args: argparse.Namespace) -> int:
    missing = _missing_slack(config, http=False)
    if missing and not args.verbose:
        logs.configure(config.log_format, logging.ERROR)  # the console keeps the terminal
    if not missing:  # before anything starts: a rejected token stops here, in one line
        check_slack(config, http=False)
    rt = open_runtime(config)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    workers = max(1, args.workers)
    if not missing:
        supervisor = Supervisor(child_env(rt, config))
        for n in range(workers):
            supervisor.start(f"worker-{n + 1}", ["worker"])
        supervisor.start("bot", ["bot"])
        plural = "s" if workers > 1 else ""
        print(
            f"Starting Switchboard: the bot (Socket Mode) and {workers} worker{plural}. "
            "Ctrl-C stops everything."
        )
        return supervisor.watch()
    print(
        "Slack is not configured (missing " + ", ".join(missing) + "), so the bot is not started.\n"
        "Starting the terminal console instead; see README.md, 'In Slack' to connect Slack.\n"
    )
    env = child_env(rt, config)
    guard = WorkerGuard(rt, env, log_dir=_log_dir(args), count=workers, always=True)
    return _console(Console(rt, workers=guard), guard)


def _missing_slack(config: Config, *, http: bool) -> list[str]:
    needed = {"SLACK_BOT_TOKEN": config.slack_bot_token}
    if http:
        needed["SLACK_SIGNING_SECRET"] = config.slack_signing_secret
    else:
        needed["SLACK_APP_TOKEN"] = config.slack_app_token
    return [name for name, value in needed.items() if not value]


def _no_model() -> str:
    return (
        "switchboard: no model is configured (environment or .env); set OPENAI_API_KEY (and "
        "optionally SWITCHBOARD_MODEL, default gpt-4.1-mini) to use OpenAI, or OPENAI_BASE_URL "
        "for any OpenAI-compatible server (vLLM, Ollama, LiteLLM, Azure…)"
    )
