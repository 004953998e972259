"""`switchboard demos check|list|add|review`: the task library from the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import load_tools, open_runtime, task_library
from tools.registry import registry
from worker.library import (
    DEFAULT_LIBRARY,
    DemoError,
    TaskLibrary,
    candidate_from_run,
    check,
    load_file,
)
from worker.runtime import Runtime
from worker.service import runs

NO_SHIPPED_LIBRARY = (
    "ok: no task library file (SWITCHBOARD_DEMOS is unset, and the shipped one demonstrates "
    "the built-in sample tools, which are not loaded); demonstrations saved from runs are "
    "checked when they are accepted"
)


def add_commands(verbs: Any) -> None:
    demos = verbs.add_parser("demos", help=help_of("demos"), description=__doc__)
    demos.set_defaults(handler=lambda c, a: _help(demos))
    sub = demos.add_subparsers(title="demos commands", metavar="ACTION")
    p = sub.add_parser("check", help="validate every demonstration against the tools")
    p.set_defaults(handler=cmd_check)
    p = sub.add_parser("list", help="the library with usage counts")
    p.set_defaults(handler=cmd_list)
    p.add_argument("--candidates", action="store_true", help="only candidates awaiting review")
    p = sub.add_parser("add", help="promote a completed run to a candidate demonstration")
    p.set_defaults(handler=cmd_add)
    p.add_argument(
        "--from-run",
        required=True,
        metavar="RUN_ID",
        help="a completed run whose tool calls succeeded (`switchboard runs list`)",
    )
    p = sub.add_parser("review", help="accept or reject candidates (interactive without flags)")
    p.set_defaults(handler=cmd_review)
    p.add_argument(
        "--accept", metavar="ID", action="append", default=[], help="accept this candidate"
    )
    p.add_argument(
        "--reject", metavar="ID", action="append", default=[], help="reject this candidate"
    )


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _library(config: Config) -> tuple[Runtime, TaskLibrary]:
    rt = open_runtime(config)
    if rt.demos is None:  # demonstrations are turned off
        return rt, task_library(config, rt)
    return rt, rt.demos.library


def cmd_check(config: Config, args: argparse.Namespace) -> int:
    """Checks the file without starting the runtime, which would refuse a bad library."""
    load_tools(config)
    if config.demos_path is None and not config.builtin_tools:
        print(NO_SHIPPED_LIBRARY)
        return 0
    path = config.demos_path or DEFAULT_LIBRARY
    try:
        demos = load_file(path)
    except DemoError as exc:
        print(f"FAIL {exc}")
        return 1
    problems = check(demos, registry)
    for problem in problems:
        print(f"FAIL {path}: {problem}")
    if problems:
        return 1
    print(f"ok: {len(demos)} demonstrations in {path} match the registered tools")
    return 0


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    _rt, library = _library(config)
    usage = library.usage()
    demos = library.candidates() if args.candidates else library.all()
    if not demos:
        print("no demonstrations")
    for demo in demos:
        tools = ",".join(sorted(demo.tools))
        print(
            f"{demo.id:<40} {demo.status:<9} used {usage.get(demo.id, 0):>5}  "
            f"[{tools}]  {demo.task[:60]}"
        )
    return 0


def cmd_add(config: Config, args: argparse.Namespace) -> int:
    rt, library = _library(config)
    run = runs.find(rt, args.from_run)
    if run is None:
        print(f"switchboard: no run {args.from_run!r}", file=sys.stderr)
        return 2
    try:
        demo = candidate_from_run(run)
        library.add_candidate(demo)
    except DemoError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    print(f"candidate {demo.id} added; not selected until accepted (`switchboard demos review`)")
    return 0


def cmd_review(config: Config, args: argparse.Namespace) -> int:
    _rt, library = _library(config)
    decisions = [(i, True) for i in args.accept] + [(i, False) for i in args.reject]
    if not decisions:
        decisions = _ask(library)
    status = 0
    for demo_id, accept in decisions:
        try:
            if accept:
                library.accept(demo_id, registry)
                print(f"accepted {demo_id}")
            elif library.reject(demo_id):
                print(f"rejected {demo_id}")
            else:
                print(f"switchboard: no candidate {demo_id!r}", file=sys.stderr)
                status = 2
        except DemoError as exc:
            print(f"switchboard: {exc}", file=sys.stderr)
            status = 2
    return status


def _ask(library: TaskLibrary) -> list[tuple[str, bool]]:
    decisions: list[tuple[str, bool]] = []
    candidates = library.candidates()
    if not candidates:
        print("no candidates to review")
    for demo in candidates:
        print("\n" + demo.as_text())
        try:
            answer = input("accept? [y]es / [n]o / [s]kip: ").strip().lower()
        except EOFError:
            break
        if answer.startswith("y"):
            decisions.append((demo.id, True))
        elif answer.startswith("n"):
            decisions.append((demo.id, False))
    return decisions
