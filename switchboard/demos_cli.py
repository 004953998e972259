"""`switchboard demos check|list|add|review`: the task library from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from switchboard.errors import CliError
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
from worker.service.library import preview

MAX_QUESTIONS_FILE = 1_000_000  # bytes
MAX_QUESTIONS = 2000
SHOWN_LEFT_OUT = 3  # per question, the best ones left out

NO_SHIPPED_LIBRARY = (
    "ok: no task library file (SWITCHBOARD_DEMOS is unset, and the shipped one demonstrates "
    "the built-in sample tools, which are not loaded); demonstrations saved from runs are "
    "checked when they are accepted"
)


def add_commands(verbs: Any) -> None:
    demos = verbs.add_parser("demos", help=help_of("demos"), description=__doc__)
    demos.set_defaults(handler=lambda c, a: _help(demos))
    sub = demos.add_subparsers(title="demos commands", metavar="ACTION")
    p = sub.add_parser(
        "check",
        help="validate every demonstration against the tools; with --questions, what each "
        "question would be shown",
        description="Validates every demonstration of the task library against the registered "
        "tools and their schemas. With --questions FILE, then shows what each question in it "
        "would be shown, as if its asker may call every tool: the demonstrations chosen with "
        "their scores, and the best ones left out with their scores and why (a tool the person "
        "may not call, below the relevance floor SWITCHBOARD_DEMOS_MIN_SCORE, a write the "
        "question does not ask for, not among the best SWITCHBOARD_DEMOS_K). Scores are BM25 "
        "as a share of a perfect match (0 to 1), or cosine similarity with "
        "SWITCHBOARD_DEMO_SELECTOR=embeddings. Nothing is recorded.",
    )
    p.set_defaults(handler=cmd_check)
    p.add_argument(
        "--questions",
        type=Path,
        metavar="FILE",
        help="questions, one a line (blank lines and lines starting with # are skipped), or "
        "a cases file of `switchboard eval` (its questions)",
    )
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
    if args.questions is not None:
        return show_selections(config, read_questions(args.questions))
    return 0


def read_questions(path: Path) -> list[str]:
    """The questions of FILE: its lines, or the questions of an eval cases file."""
    try:
        if path.stat().st_size > MAX_QUESTIONS_FILE:
            raise CliError(f"{path}: over {MAX_QUESTIONS_FILE:,} bytes; split it")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read the questions: {exc}") from exc
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CliError(f"{path}: not YAML: {' '.join(str(exc).split())}") from exc
        cases = data.get("cases") if isinstance(data, dict) else None
        if not isinstance(cases, list):
            raise CliError(f"{path}: expected a cases file with a 'cases' list")
        questions = [str(c["question"]) for c in cases if isinstance(c, dict) and c.get("question")]
    else:
        questions = [line.strip() for line in text.splitlines()]
        questions = [q for q in questions if q and not q.startswith("#")]
    if not questions:
        raise CliError(f"{path}: no questions in it")
    return questions[:MAX_QUESTIONS]


def show_selections(config: Config, questions: list[str]) -> int:
    rt = open_runtime(config)
    given = 0
    for question in questions:
        selection = preview(rt, question)
        if selection is None:
            print("demonstrations are off (SWITCHBOARD_DEMOS_K=0): no question gets any")
            return 0
        given += bool(selection.chosen)
        print(f"\n{' '.join(question.split())[:300]}")
        if not selection.chosen:
            print("  (no demonstration)")
        for c in selection.chosen:
            print(f"  shown     {c.demo.id:<36} {c.score:.2f}")
        for c in [c for c in selection.dropped if c.score > 0][:SHOWN_LEFT_OUT]:
            print(f"  left out  {c.demo.id:<36} {c.score:.2f}  {c.why}")
    print(
        f"\n{len(questions)} questions: {given} get demonstrations, {len(questions) - given} "
        f"get none (relevance floor {config.demos_min_score:.2f}, up to {config.demos_k} each)"
    )
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
