"""`switchboard`: the command line. Every verb builds the same runtime from the environment."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import redis
from pydantic import ValidationError

from switchboard import logs
from switchboard.redisconn import url_of
from switchboard.settings import Config
from switchboard.wiring import open_runtime
from tools import OperatorError
from worker.run import RunStatus
from worker.runtime import Runtime

DESCRIPTION = """\
Switchboard: an LLM agent in Slack that calls tools with the asking user's permissions and
runs anything with side effects only after a person approves it.

Configuration comes from the environment or a .env file: SLACK_BOT_TOKEN, SLACK_APP_TOKEN,
SLACK_SIGNING_SECRET, OPENAI_API_KEY, OPENAI_BASE_URL, SWITCHBOARD_MODEL, REDIS_URL (unset:
an embedded Redis under ~/.local/share/switchboard), SWITCHBOARD_POLICY, SWITCHBOARD_TOOLS,
SWITCHBOARD_DEMOS. See README.md.
"""

EPILOG = """\
examples:
  switchboard chat                      ask in the terminal, approve at the prompt
  switchboard dev                       bot + workers (+ embedded Redis) in one process tree
  switchboard worker --processes 2 --concurrency 64
                                        two worker processes carrying 64 runs each
  switchboard runs list --status awaiting_approval
  switchboard runs show r18c2f3a9b1c2d3e4 --json
"""


class CliError(OperatorError):
    """A problem the operator can fix; printed without a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        config = Config()
    except ValidationError as exc:
        print(f"switchboard: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format)
    try:
        result: int = args.handler(config, args)
        return result
    except OperatorError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    except redis.ConnectionError as exc:
        print(f"switchboard: cannot reach Redis ({exc}); check REDIS_URL", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND")

    def verb(name: str, help_text: str, handler: Callable[..., int]) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = verb("dev", "bot, workers and (when REDIS_URL is unset) Redis in one process tree", cmd_dev)
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")

    p = verb("bot", "the Slack bot (Socket Mode, or HTTP with --http)", cmd_bot)
    p.add_argument("--http", action="store_true", help="serve /slack/events over HTTP")
    p.add_argument("--port", type=int, default=3000, help="HTTP port (default 3000)")

    p = verb("worker", "run workers that advance runs from the queue", cmd_worker)
    p.add_argument("--processes", type=positive, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--concurrency",
        type=positive,
        metavar="N",
        help="runs each process carries at once (default SWITCHBOARD_WORKER_CONCURRENCY, 32)",
    )
    p.add_argument("--burst", action="store_true", help="stop when the queue is empty")

    p = verb("chat", "ask questions in the terminal and answer approvals at the prompt", cmd_chat)
    p.add_argument("--user", help="the Slack user id to act as (default console:$USER)")

    runs = verb("runs", "inspect runs", lambda c, a: _usage(runs))
    run_verbs = runs.add_subparsers(title="runs commands", metavar="ACTION")
    p = run_verbs.add_parser("list", help="recent runs, newest first")
    p.set_defaults(handler=cmd_runs_list)
    p.add_argument("--user", help="only this user's runs")
    p.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this state")
    p.add_argument("--limit", type=int, default=20)
    p = run_verbs.add_parser("show", help="a run's whole trajectory")
    p.set_defaults(handler=cmd_runs_show)
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = run_verbs.add_parser("cancel", help="cancel a run (as an operator)")
    p.set_defaults(handler=cmd_runs_cancel)
    p.add_argument("run_id")

    from switchboard import demos_cli, eval_cli, tools_cli

    demos_cli.add_commands(verbs)
    tools_cli.add_command(verbs)
    eval_cli.add_command(verbs)
    return parser


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def child_env(rt: Runtime, config: Config) -> dict[str, str]:
    """Children reach the same Redis; an embedded server is shared through its socket."""
    return {} if config.redis_url else {"REDIS_URL": url_of(rt.redis)}


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
    rt = open_runtime(config)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    if args.processes <= 1:
        from worker.process import serve

        serve(rt, burst=args.burst)
        return 0
    from switchboard.supervise import Supervisor

    child = ["worker", "--concurrency", str(config.worker_concurrency)]
    supervisor = Supervisor(child_env(rt, config))
    for n in range(args.processes):
        supervisor.start(f"worker-{n + 1}", [*child, *(["--burst"] if args.burst else [])])
    return supervisor.watch(restart=not args.burst)


def cmd_chat(config: Config, args: argparse.Namespace) -> int:
    from rq import Worker

    from switchboard.console import Console
    from switchboard.supervise import Supervisor

    rt = open_runtime(config)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    supervisor = None
    if Worker.count(queue=rt.queue) == 0:
        supervisor = Supervisor(child_env(rt, config))
        supervisor.start("worker", ["worker"])
    try:
        return Console(rt, user_id=args.user).loop()
    finally:
        if supervisor is not None:
            supervisor.stop()


def cmd_bot(config: Config, args: argparse.Namespace) -> int:
    missing = _missing_slack(config, http=args.http)
    if missing:
        raise CliError(
            "the Slack bot needs " + ", ".join(missing) + ". See README.md, 'Slack setup'."
        )
    from bot.serve import serve

    return serve(
        open_runtime(config),
        bot_token=config.slack_bot_token,
        app_token=config.slack_app_token,
        signing_secret=config.slack_signing_secret,
        api_url=config.slack_api_url,
        http=args.http,
        port=args.port,
    )


def cmd_dev(config: Config, args: argparse.Namespace) -> int:
    from switchboard.supervise import Supervisor

    rt = open_runtime(config)
    if rt.model is None:
        print(_no_model(), file=sys.stderr)
        return 2
    missing = _missing_slack(config, http=False)
    supervisor = Supervisor(child_env(rt, config))
    for n in range(max(1, args.workers)):
        supervisor.start(f"worker-{n + 1}", ["worker"])
    if not missing:
        supervisor.start("bot", ["bot"])
        print("Switchboard is running: bot (Socket Mode) and workers. Ctrl-C stops everything.")
        return supervisor.watch()
    print(
        "Slack is not configured (missing " + ", ".join(missing) + "), so the bot is not started.\n"
        "Starting the terminal console instead; see README.md to connect Slack.\n"
    )
    from switchboard.console import Console

    try:
        return Console(rt).loop()
    finally:
        supervisor.stop()


def cmd_runs_list(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_line

    rt = open_runtime(config)
    status = RunStatus(args.status) if args.status else None
    runs = rt.store.recent(user_id=args.user, status=status, limit=max(1, min(args.limit, 500)))
    if not runs:
        print("no runs")
    for run in runs:
        print(run_line(run))
    return 0


def cmd_runs_show(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_json, trajectory

    rt = open_runtime(config)
    run = rt.store.find(args.run_id)
    if run is None:
        raise CliError(f"no run {args.run_id!r} (runs are kept {config.retention_days:g} days)")
    events = rt.events.read(run.id)
    print(run_json(run, events) if args.json else trajectory(run, events))
    return 0


def cmd_runs_cancel(config: Config, args: argparse.Namespace) -> int:
    from worker import service

    rt = open_runtime(config)
    operator = f"cli:{os.environ.get('USER', 'operator')}"
    run = rt.store.find(args.run_id)
    if run is None:
        raise CliError(f"no run {args.run_id!r}")
    result = service.cancel(rt, run.id, by=operator, roles=frozenset({"__operator__"}) | _admin(rt))
    print(f"{run.id}: {result.value}")
    return 0 if result == service.CancelResult.CANCELLING else 1


def _admin(rt: Runtime) -> frozenset[str]:
    """The shell operator has the admin roles: whoever runs the CLI can read Redis anyway."""
    return frozenset(rt.policy.admins)


def _missing_slack(config: Config, *, http: bool) -> list[str]:
    needed = {"SLACK_BOT_TOKEN": config.slack_bot_token}
    if http:
        needed["SLACK_SIGNING_SECRET"] = config.slack_signing_secret
    else:
        needed["SLACK_APP_TOKEN"] = config.slack_app_token
    return [name for name, value in needed.items() if not value]


def _no_model() -> str:
    return (
        "switchboard: no model is configured. Set OPENAI_API_KEY (and optionally "
        "SWITCHBOARD_MODEL, default gpt-4.1-mini) to use OpenAI, or OPENAI_BASE_URL to use any "
        "OpenAI-compatible server (vLLM, Ollama, LiteLLM, Azure…)."
    )
