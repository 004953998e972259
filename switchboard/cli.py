"""`switchboard`: the command line. Every verb builds the same runtime from the environment.

Only the standard library is imported before the arguments are read: each verb's module
(`switchboard.verbs`) is imported when that verb runs, so `--version` and `--help` cost
little more than starting Python (bench/bench_cli.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from switchboard import __version__
from switchboard.verbs import VERBS

if TYPE_CHECKING:
    from switchboard.settings import Config

DESCRIPTION = """\
Switchboard: an LLM agent in Slack that calls tools with the asking user's permissions and
runs anything with side effects only after a person approves it.

Configuration comes from the environment or a .env file: SLACK_BOT_TOKEN, SLACK_APP_TOKEN,
SLACK_SIGNING_SECRET, OPENAI_API_KEY, OPENAI_BASE_URL, SWITCHBOARD_MODEL, REDIS_URL (unset:
an embedded Redis under ~/.local/share/switchboard), SWITCHBOARD_POLICY, SWITCHBOARD_TOOLS,
SWITCHBOARD_MCP, SWITCHBOARD_DEMOS, SWITCHBOARD_WORKER_CONCURRENCY. See README.md.
"""

EPILOG = """\
examples:
  switchboard chat                      ask in the terminal, approve at the prompt
  switchboard dev                       bot + workers (+ embedded Redis) in one process tree
  switchboard worker --processes 2 --concurrency 64
                                        two worker processes carrying 64 runs each
  switchboard runs list --status awaiting_approval
  switchboard runs show r18c2f3a9b1c2d3e4 --json
  switchboard approvals list            decisions left open, in the console or in Slack
  switchboard approvals approve ap_e42041134594c60f45ab

--debug and --verbose work anywhere on the line.
"""

# Recognized anywhere on the command line (before a bare `--`), by every verb.
GLOBAL_FLAGS = {"--debug": "debug", "--verbose": "verbose", "-v": "verbose"}


def main(argv: Sequence[str] | None = None) -> int:
    flags, rest = _global_flags(sys.argv[1:] if argv is None else list(argv))
    verb = _verb_in(rest)
    if argv is None and verb == "worker" and not {"-h", "--help"} & set(rest):
        from worker import pool
        from worker.memory import reexec_with_tunables

        # before the imports of its parser and runtime: a process of its own, not a
        # caller's, with its allocator set up for many threads (worker/memory.py), then its
        # slots on one gevent hub unless it is asked for threads (worker/pool.py)
        reexec_with_tunables()
        if pool.requested(rest) == "gevent":
            pool.patch()
    parser = build_parser(verb)
    args = parser.parse_args(rest)
    args.debug, args.verbose = "debug" in flags, "verbose" in flags
    args.verb = verb
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return run(args)


def run(args: argparse.Namespace) -> int:
    """The verb, with the configuration read and logging set up, its errors in one line."""
    import logging

    redis = import_redis()
    from pydantic import ValidationError

    from switchboard import errors, logs
    from switchboard.settings import Config
    from switchboard.supervise import watch_lifeline
    from tools.exceptions import OperatorError

    watch_lifeline()  # a child of `dev`/`chat`/`worker --processes` stops with its parent
    _import_from_cwd()
    try:
        config = Config()
    except ValidationError as exc:
        if args.debug:
            traceback.print_exc()
        defaults = {f.alias: f.default for f in Config.model_fields.values() if f.alias is not None}
        print("\n".join(errors.settings_errors(exc, defaults)), file=sys.stderr)
        return 2
    quiet = getattr(args, "log_level", logging.WARNING)
    logs.configure(config.log_format, logging.INFO if args.verbose else quiet)
    tracing_on = _start_tracing(config, args)
    try:
        result: int = args.handler(config, args)
        return result
    except OperatorError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"switchboard: {exc}", file=sys.stderr)
        return exit_status(exc)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if args.debug:
            traceback.print_exc()
        from switchboard.redisconn import unavailable

        # Redis answered the start-up check, then failed: for a service that waits for it,
        # a restart may find it back
        waits = config.redis_start_wait > 0 and getattr(args, "service", False)
        problem = unavailable(config.redis_url, exc, temporary=waits)
        print(f"switchboard: {problem}", file=sys.stderr)
        return exit_status(problem)
    except KeyboardInterrupt:
        return 130
    finally:
        if tracing_on:
            from worker import tracing

            tracing.shutdown()  # what is buffered goes out before the process does


def exit_status(problem: Exception) -> int:
    """75 (EX_TEMPFAIL) for a Redis that did not answer a service's wait; else 2."""
    from switchboard import errors

    unavailable = isinstance(problem, errors.RedisUnavailable)
    return errors.UNAVAILABLE_EXIT if unavailable else errors.CONFIG_EXIT


def import_redis() -> ModuleType:
    """redis-py, and structlog, each imported without an optional module it picks up
    whenever it is installed and Switchboard never uses (`_without`), first as a verb's
    parser is built (the bot's and the worker's modules import both), then importable
    again as ever:

    - redis-py (8) imports OpenTelemetry's metrics SDK (redis/observability/providers.py),
      only to learn that it could record Redis metrics, which Switchboard never asks it to.
      The SDK is installed for traces, so every process paid that import: measured 0.55 s
      of a 1.7 s `import redis` on a loaded 2-core machine (`python -X importtime`, medians
      of 5); 8 MiB imported alone, 2 MiB of an idle bot's RSS (75.8 -> 73.7 MiB).
    - structlog imports `rich` (structlog/dev.py, tracebacks.py) to colour the console's
      tracebacks. No dependency of Switchboard's brings it, so a deployment never has it,
      but a development install does (import-linter's): 4.8 MiB of every process's RSS
      there (17.3 against 12.5 MiB for `import structlog`), which the benchmarks counted
      though no deployment runs it, and a console whose tracebacks differ from production's.
    """
    _without("redis", "opentelemetry.sdk.metrics")
    _without("structlog", "rich")
    import redis

    return redis


def _without(module: str, hidden: str) -> None:
    """`module` imported while `hidden` is not importable (`import` raises ImportError)."""
    if module in sys.modules or hidden in sys.modules:
        return
    sys.modules[hidden] = None  # type: ignore[assignment]
    try:
        importlib.import_module(module)
    finally:
        del sys.modules[hidden]


def _start_tracing(config: Config, args: argparse.Namespace) -> bool:
    """OpenTelemetry traces, when the OTEL_* environment asks for them (worker/tracing.py).
    Nothing of OpenTelemetry is imported otherwise."""
    from worker import tracing

    if not tracing.configured():
        return False
    return tracing.setup(
        args.verb or "switchboard",
        user_ids=config.trace_user_ids,
        known_secrets=config.secret_values,
    )


def _global_flags(argv: list[str]) -> tuple[set[str], list[str]]:
    flags: set[str] = set()
    rest: list[str] = []
    for n, arg in enumerate(argv):
        if arg == "--":
            rest += argv[n:]
            break
        if arg in GLOBAL_FLAGS:
            flags.add(GLOBAL_FLAGS[arg])
        else:
            rest.append(arg)
    return flags, rest


def _verb_in(argv: list[str]) -> str | None:
    """The verb: the first argument that is not an option (the top level takes no values)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in VERBS else None
    return None


def _import_from_cwd() -> None:
    """Tool modules in the current folder import as they do under `python -m switchboard`
    (the `switchboard` script's own folder is first on the path, not the current one). At
    the end of the path, so a stray file never shadows an installed package."""
    if not sys.flags.safe_path and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def build_parser(verb: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """Every verb listed; only `verb`'s own arguments (and module) loaded, or with `every`
    all of them (for tests that read every verb's options)."""
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of a configuration error"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show log lines (the console hides them)"
    )
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, spec in VERBS.items():
        if every or verb == name:
            import_redis()  # before the verb's module, which may import it (see there)
            getattr(importlib.import_module(spec.module), spec.add)(verbs)
        else:
            verbs.add_parser(name, help=spec.help)
    return parser
