"""`switchboard runs list|show|cancel`: recent runs, a run's whole trajectory, cancelling one
as the operator."""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

from switchboard.errors import CliError
from switchboard.settings import Config
from switchboard.wiring import open_runtime
from worker.run import SCHEMA_VERSION, RunSchemaError, RunStatus
from worker.runtime import Runtime

OPERATOR_ROLE = "__operator__"


def add_command(verbs: Any) -> None:
    runs = verbs.add_parser("runs", help="inspect runs", description="inspect runs")
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
    runs = rt.store.recent(user_id=args.user, status=status, limit=max(1, min(args.limit, 500)))
    if not runs:
        print("no runs")
    for run in runs:
        print(run_line(run))
    if rt.store.skipped_unknown:
        print(unknown_note(rt.store.skipped_unknown))
    return 0


def unknown_note(count: int) -> str:
    return (
        f"({count} run{'s' if count != 1 else ''} of another schema version left out: "
        "written by another Switchboard release; see README.md, 'Upgrading')"
    )


def unreadable(run_id: str, exc: RunSchemaError) -> CliError:
    return CliError(
        f"run {run_id} has schema_version {exc.version!r}, which this Switchboard (schema "
        f"{SCHEMA_VERSION}) cannot read; use the release that wrote it (README.md, 'Upgrading')"
    )


def cmd_show(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_json, trajectory

    rt = open_runtime(config)
    try:
        run = rt.store.find(args.run_id)
    except RunSchemaError as exc:
        raise unreadable(args.run_id, exc) from None
    if run is None:
        raise CliError(f"no run {args.run_id!r} (runs are kept {config.retention_days:g} days)")
    events = rt.events.read(run.id)
    print(run_json(run, events) if args.json else trajectory(run, events))
    return 0


def cmd_cancel(config: Config, args: argparse.Namespace) -> int:
    from worker import service

    rt = as_operator(open_runtime(config))
    operator = f"cli:{os.environ.get('USER', 'operator')}"
    try:
        run = rt.store.find(args.run_id)
    except RunSchemaError as exc:
        raise unreadable(args.run_id, exc) from None
    if run is None:
        raise CliError(f"no run {args.run_id!r}")
    result = service.cancel(rt, run.id, by=operator, roles=frozenset({OPERATOR_ROLE}))
    print(f"{run.id}: {result.value}")
    return 0 if result == service.CancelResult.CANCELLING else 1


def as_operator(rt: Runtime) -> Runtime:
    """The runtime as the shell operator sees it: an admin, whether or not the policy names
    any (whoever runs the CLI against this Redis could read and change it anyway). The
    policy's own admins are unchanged; only this process's view adds the operator."""
    policy = copy.copy(rt.policy)
    policy.admins = (*rt.policy.admins, OPERATOR_ROLE)
    view = copy.copy(rt)
    view.policy = policy
    return view
