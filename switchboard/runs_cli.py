"""`switchboard runs list|show|cancel`: recent runs, a run's whole trajectory, cancelling one
as the operator."""

from __future__ import annotations

import argparse
import os
from typing import Any

from switchboard.errors import CliError
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import open_runtime
from worker.run import RunStatus
from worker.service import runs


def add_command(verbs: Any) -> None:
    runs = verbs.add_parser("runs", help=help_of("runs"), description=help_of("runs"))
    runs.set_defaults(handler=lambda c, a: _usage(runs))
    run_verbs = runs.add_subparsers(title="runs commands", metavar="ACTION")
    p = run_verbs.add_parser("list", help="recent runs, newest first")
    p.set_defaults(handler=cmd_list)
    p.add_argument("--user", help="only this user's runs")
    p.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this state")
    p.add_argument("--limit", type=int, default=20)
    p = run_verbs.add_parser("show", help="a run's whole trajectory")
    p.set_defaults(handler=cmd_show)
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = run_verbs.add_parser("cancel", help="cancel a run (as an operator)")
    p.set_defaults(handler=cmd_cancel)
    p.add_argument("run_id")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_line

    rt = open_runtime(config)
    status = RunStatus(args.status) if args.status else None
    found = runs.recent(rt, user_id=args.user, status=status, limit=max(1, min(args.limit, 500)))
    if not found:
        print("no runs")
    for run in found:
        print(run_line(run))
    return 0


def cmd_show(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_json, trajectory

    rt = open_runtime(config)
    run = runs.find(rt, args.run_id)
    if run is None:
        raise CliError(f"no run {args.run_id!r} (runs are kept {config.retention_days:g} days)")
    events = runs.inspect(rt, run).events
    print(run_json(run, events) if args.json else trajectory(run, events))
    return 0


def cmd_cancel(config: Config, args: argparse.Namespace) -> int:
    """As the shell operator, who may cancel any run: whoever runs the CLI against this
    Redis could read and change it anyway (`runs.request_cancel`, no permission check)."""
    rt = open_runtime(config)
    operator = f"cli:{os.environ.get('USER', 'operator')}"
    run = runs.find(rt, args.run_id)
    if run is None:
        raise CliError(f"no run {args.run_id!r}")
    result = runs.request_cancel(rt, run, by=operator)
    print(f"{run.id}: {result.value}")
    return 0 if result == runs.CancelResult.CANCELLING else 1
