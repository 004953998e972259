"""`switchboard runs list|show|cancel|export`: runs by user, channel, status and time, a
run's whole trajectory, cancelling one as the operator, and exporting runs as JSON Lines."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from switchboard.errors import CliError
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import open_runtime
from worker.audit import (
    MAX_LIMIT,
    RunFilter,
    WhenError,
    parse_when,
    run_summary,
)
from worker.run import SCHEMA_VERSION, RunSchemaError, RunStatus
from worker.service import runs


def add_command(verbs: Any) -> None:
    runs = verbs.add_parser("runs", help=help_of("runs"), description=help_of("runs"))
    runs.set_defaults(handler=lambda c, a: _usage(runs))
    run_verbs = runs.add_subparsers(title="runs commands", metavar="ACTION")
    p = run_verbs.add_parser(
        "list",
        help="recent runs, newest first",
        description="Recent runs, newest first. Times: ISO 8601 (2026-12-01, "
        "2026-12-01T09:30Z; UTC unless an offset is given) or how long ago (30m, 24h, 7d).",
    )
    p.set_defaults(handler=cmd_list)
    p.add_argument("--user", metavar="U", help="only runs asked by this Slack user id")
    p.add_argument("--channel", metavar="C", help="only runs asked in this channel id")
    p.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this state")
    p.add_argument("--since", metavar="T", help="only runs created at or after T")
    p.add_argument("--until", metavar="T", help="only runs created at or before T")
    p.add_argument(
        "--limit",
        type=int,
        default=20,
        help=f"at most this many runs (default 20, up to {MAX_LIMIT})",
    )
    p.add_argument("--json", action="store_true", help="one JSON document: the runs and counts")
    p = run_verbs.add_parser(
        "export",
        help="runs with their whole trajectory as JSON Lines",
        description="Every run created in the time range, oldest first, one JSON object a "
        "line: the run and all its events (tool calls, approvals and who decided them). "
        "Streamed; redirect it to a file (runs are kept SWITCHBOARD_RETENTION_DAYS).",
    )
    p.set_defaults(handler=cmd_export)
    p.add_argument("--since", metavar="T", required=True, help="runs created at or after T")
    p.add_argument("--until", metavar="T", help="runs created at or before T (default: now)")
    p = run_verbs.add_parser("show", help="a run's whole trajectory")
    p.set_defaults(handler=cmd_show)
    p.add_argument("run_id", help="the run's id (r..., from `runs list` or the run's thread)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = run_verbs.add_parser("cancel", help="cancel a run (as an operator)")
    p.set_defaults(handler=cmd_cancel)
    p.add_argument("run_id", help="the run's id (r..., from `runs list`)")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    from switchboard.render import run_line

    where = RunFilter(
        user_id=args.user or None,
        channel_id=args.channel or None,
        status=RunStatus(args.status) if args.status else None,
        since=_when(args.since, "--since"),
        until=_when(args.until, "--until"),
    )
    _check_range(where.since, where.until)
    rt = open_runtime(config)
    found = runs.search(rt, where, limit=args.limit)
    if args.json:
        body = {
            "runs": [run_summary(run) for run in found.runs],
            "count": len(found.runs),
            "truncated": found.truncated,
            "skipped_unknown_schema": runs.skipped_unknown(rt),
        }
        print(json.dumps(body, indent=2, ensure_ascii=False))
        return 0
    if not found.runs:
        print("no runs")
    for run in found.runs:
        print(run_line(run))
    if found.truncated:
        print(f"(stopped after reading {found.scanned} runs: narrow it with --since/--until)")
    if skipped := runs.skipped_unknown(rt):
        print(unknown_note(skipped))
    return 0


def cmd_export(config: Config, args: argparse.Namespace) -> int:
    since = _when(args.since, "--since")
    until = _when(args.until, "--until")
    assert since is not None  # required
    _check_range(since, until)
    rt = open_runtime(config)
    out = sys.stdout
    count = 0
    try:
        for entry in runs.export(rt, since, until):
            out.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
            if count % 100 == 0:
                out.flush()
        out.flush()
    except BrokenPipeError:  # `| head`: the reader has had enough
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return 0
    skipped = runs.skipped_unknown(rt)
    note = f"; {unknown_note(skipped)}" if skipped else ""
    print(f"exported {count} run{'s' if count != 1 else ''}{note}", file=sys.stderr)
    return 0


def _when(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_when(text)
    except WhenError as exc:
        raise CliError(f"{flag}: {exc}") from None


def _check_range(since: float | None, until: float | None) -> None:
    if since is not None and until is not None and since > until:
        raise CliError("--since is after --until: swap them")


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
        run = runs.find(rt, args.run_id)
    except RunSchemaError as exc:
        raise unreadable(args.run_id, exc) from None
    if run is None:
        raise CliError(f"no run {args.run_id!r} (runs are kept {config.retention_days:g} days)")
    seen = runs.inspect(rt, run)
    trace = seen.trace.url or seen.trace.trace_id if seen.trace else ""
    print(run_json(run, seen.events) if args.json else trajectory(run, seen.events, trace))
    return 0


def cmd_cancel(config: Config, args: argparse.Namespace) -> int:
    """As the shell operator, who may cancel any run: whoever runs the CLI against this
    Redis could read and change it anyway (`runs.request_cancel`, no permission check)."""
    rt = open_runtime(config)
    operator = f"cli:{os.environ.get('USER', 'operator')}"
    try:
        run = runs.find(rt, args.run_id)
    except RunSchemaError as exc:
        raise unreadable(args.run_id, exc) from None
    if run is None:
        raise CliError(f"no run {args.run_id!r}")
    result = runs.request_cancel(rt, run, by=operator)
    print(f"{run.id}: {result.value}")
    return 0 if result == runs.CancelResult.CANCELLING else 1
