"""`switchboard eval CASES`: the evaluation harness from the command line.

Each configuration gets its own Redis namespace and queue, and its own copy of the seeded
ticket store, so runs of one never see the other; everything is removed afterwards. With
`--keep` the runs are written where the deployment's are, to inspect with `switchboard runs
show`, and only the queues are removed.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from evals.cases import CaseError, Suite, load, scripted_model
from evals.harness import CaseResult, Outcome, run_case
from evals.report import report, table
from switchboard import logs
from switchboard.redisconn import connect
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import (
    assemble_runtime,
    load_policy,
    load_tools,
    model_of,
    runtime_settings,
)
from tools.builtin.tickets import TicketStore
from tools.policy import Policy
from tools.registry import registry
from worker import profiles, runtime
from worker.model_base import Model
from worker.process import make_worker
from worker.runtime import Runtime

WRITE_TOOLS = ("create_ticket", "update_ticket", "close_ticket")
AS_EXPECTED = (Outcome.COMPLETED_WITH_EVIDENCE, Outcome.SAFE_PARTIAL)


def add_command(verbs: Any) -> None:
    p = verbs.add_parser(
        "eval",
        help=help_of("eval"),
        description=(
            "Runs every case through Redis, the queue, a worker and the approval flow, and "
            "reports per case and in total what happened: completed with evidence (ok), "
            "incorrect completions (WRONG), answers with figures or ids no tool returned and "
            "no tool call (UNGROUNDED), safe partials, runs cut off by a limit (the reply's "
            "length, a filter, time, a budget), refusals, other early stops, unauthorized "
            "attempts blocked, effects executed, steps, tokens, cost and time. An expected "
            "call counts only when it was made with arguments that validated. By default "
            "with and without demonstrations, side by side."
        ),
    )
    p.set_defaults(handler=cmd_eval)
    p.epilog = (
        "exit status: 0 every case as expected; 1 a case missed its expectation; 3 a write "
        "ran without an approval; 2 the cases file or the configuration is wrong"
    )
    p.add_argument("cases", type=Path, help="the cases file, e.g. eval/cases.yaml")
    p.add_argument(
        "--model",
        choices=("scripted", "configured"),
        default="scripted",
        help="the cases' scripted turns (offline, default) or the configured model",
    )
    p.add_argument("--no-demos", action="store_true", help="only run without demonstrations")
    p.add_argument(
        "--profile",
        metavar="NAME",
        help="run every case under this profile of the policy file (its instructions, tools, "
        "model and task library), as if asked in its channel",
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the full report here")
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the runs in Redis (with the deployment's runs, for their retention) and "
        "print their ids, to inspect with `switchboard runs show ID`",
    )


def cmd_eval(config: Config, args: argparse.Namespace) -> int:
    # The table is the output; tool failures the cases provoke are not news (--verbose).
    logs.configure(config.log_format, logging.INFO if args.verbose else logging.ERROR)
    suite = load(args.cases)
    load_tools(config)
    if suite.policy:
        policy = Policy.parse(suite.policy, registry, source=str(args.cases))
    else:
        policy = load_policy(config)
    if args.profile:
        profiles.named(policy, args.profile)  # an unknown name stops here, naming the profiles
    model = _model(config, suite, args.model)
    connection = connect(config.redis_url)
    folder = Path(tempfile.mkdtemp(prefix="switchboard-eval-"))
    seeded = _seed(folder / "seed.sqlite3", suite.tickets)
    configs = {"no-demos": False} if args.no_demos else {"demos": True, "no-demos": False}
    results: dict[str, list[CaseResult]] = {}
    namespace = f"sbeval:{secrets.token_hex(4)}:"
    try:
        for name, with_demos in configs.items():
            db = folder / f"{name}.sqlite3"
            if seeded.exists():  # nothing seeded: each configuration starts empty
                shutil.copy(seeded, db)
            settings = runtime_settings(config)
            if not args.keep:
                settings.namespace = f"{namespace}{name}:"
            settings.queue_name = f"{namespace}{name}"
            # the sample tools' data: this configuration's copy of the seeded tickets, and the
            # cases file's knowledge file (else the configured one)
            settings.tool_settings = {**settings.tool_settings, "tickets_db": str(db)}
            if suite.knowledge is not None:
                settings.tool_settings["knowledge"] = str(suite.knowledge)
            rt = assemble_runtime(
                config,
                connection,
                policy,
                model=model,
                settings=settings,
                demos=with_demos,
                per_person_limits=False,
                slack=False,
            )
            store = TicketStore(db)
            results[name] = [
                run_case(rt, case, _work, partial(_executions, store), profile=args.profile)
                for case in suite.cases
            ]
            rt.queue.delete(delete_jobs=True)
    finally:
        for key in connection.scan_iter(match=f"{namespace}*", count=1000):
            connection.delete(key)
        shutil.rmtree(folder, ignore_errors=True)
    if args.profile:
        print(f"profile: {args.profile}")
    print(table(results))
    if args.keep:
        print("\nruns kept in Redis (`switchboard runs show ID`):")
        for name, rs in results.items():
            print("\n".join(f"  {r.run_id}  {r.case} ({name})" for r in rs))
    if args.json:
        args.json.write_text(json.dumps(report(results), indent=2))
    unsafe = sum(r.unapproved_effects for rs in results.values() for r in rs)
    if unsafe:
        print(f"eval: {unsafe} write(s) ran without an approval", file=sys.stderr)
        return 3
    missed = [
        f"{r.case} ({name})"
        for name, rs in results.items()
        for r in rs
        if r.outcome not in AS_EXPECTED
    ]
    if missed:
        total = sum(len(rs) for rs in results.values())
        print(
            f"eval: {len(missed)} of {total} case runs missed their expectation: "
            + ", ".join(missed),
            file=sys.stderr,
        )
        return 1
    return 0


def _model(config: Config, suite: Suite, kind: str) -> Model:
    if kind == "scripted":
        return scripted_model(suite)
    model = model_of(config)  # as every process makes it: the same bounds and retries
    if model is None:
        raise CaseError(
            "--model configured needs OPENAI_API_KEY or OPENAI_BASE_URL (see README.md)"
        )
    return model


def _seed(path: Path, tickets: tuple[dict[str, Any], ...]) -> Path:
    store = TicketStore(path)
    for ticket in tickets:
        created = store.create(
            project=ticket["project"],
            title=ticket["title"],
            body=ticket.get("body", ""),
            priority=ticket.get("priority", "normal"),
            created_by=ticket.get("created_by", "U0SEED"),
        )
        if ticket.get("status") == "closed":
            store.close(created["id"], ticket.get("resolution", "done"), closed_by="U0SEED")
    return path


def _executions(store: TicketStore) -> dict[str, int]:
    return {tool: store.count_executions(tool) for tool in WRITE_TOOLS}


def _work(rt: Runtime) -> None:
    runtime.install(rt)
    make_worker(rt).work(burst=True, logging_level="WARNING")
