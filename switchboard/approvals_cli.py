"""`switchboard approvals list|show|approve|reject|grants`: decisions from the shell.

An approval left open in the console or in Slack can be decided here later. A decision is
checked against the policy like a click in Slack: `--user` names who decides (default the
console's identity, console:$USER, so what you asked in `switchboard chat` you can approve
here), with that person's roles from the policy file.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from approvals import ApprovalRequest
from switchboard.console import local_user
from switchboard.edit_args import EditInputError, with_assignments
from switchboard.render import plain, short, when
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import open_runtime
from tools.exceptions import OperatorError
from worker import service
from worker.runtime import Runtime
from worker.service import Access, approvals, grants


class ApprovalNotFoundError(OperatorError):
    """No approval with that id (or it was removed after its retention)."""


def add_command(verbs: Any) -> None:
    parser = verbs.add_parser("approvals", help=help_of("approvals"), description=__doc__)
    parser.set_defaults(handler=lambda c, a: _help(parser))
    sub = parser.add_subparsers(title="approvals commands", metavar="ACTION")
    p = sub.add_parser("list", help="approvals waiting for a decision, oldest first")
    p.set_defaults(handler=cmd_list)
    p.add_argument("--user", help="only those this person may decide")
    p = sub.add_parser("show", help="one approval: tool, exact arguments, run, who may decide")
    p.set_defaults(handler=cmd_show)
    p.add_argument("approval_id", metavar="ID", help="the approval's id (ap_..., from `list`)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    for action, verb in (("approve", "approve"), ("reject", "reject")):
        p = sub.add_parser(action, help=f"{verb} a pending call; its run goes on")
        p.set_defaults(handler=cmd_decide, approve=action == "approve")
        p.add_argument("approval_id", metavar="ID", help="the approval's id (ap_..., from `list`)")
        p.add_argument(
            "--reason", default="", help="recorded with the decision; the model reads it"
        )
        p.add_argument(
            "--user", help="decide as this person (default console:$USER, the console's identity)"
        )
        if action == "approve":
            p.add_argument(
                "--set",
                action="append",
                default=[],
                metavar="FIELD=VALUE",
                help="approve with this argument changed (repeatable); text for a string "
                "field, JSON for others; checked like the model's arguments",
            )
        else:
            p.add_argument(
                "--instructions",
                default="",
                help="tell the agent what to do instead (it reads them as your suggestion)",
            )

    grant_parser = sub.add_parser(
        "grants",
        help="standing grants: list them, or revoke one",
        description='Standing grants ("Approve and allow in this thread / for 1 hour"): '
        "each lets similar calls of one tool by one requester run without asking again.",
    )
    grant_parser.set_defaults(handler=lambda c, a: _help(grant_parser))
    grant_verbs = grant_parser.add_subparsers(title="grants commands", metavar="ACTION")
    p = grant_verbs.add_parser("list", help="grants in force, the soonest to end first")
    p.set_defaults(handler=cmd_grants_list)
    p.add_argument("--user", help="only those covering, or made by, this person")
    p = grant_verbs.add_parser("revoke", help="end a grant at once")
    p.set_defaults(handler=cmd_grants_revoke)
    p.add_argument("grant_id", metavar="ID", help="the grant's id (gr_..., from `grants list`)")
    p.add_argument(
        "--user", help="revoke as this person (default console:$USER); admins may revoke any"
    )


def cmd_grants_list(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    found = grants.allowed_for(rt, args.user) if args.user else grants.live(rt)
    if not found:
        print("no standing grants" + (f" for {args.user}" if args.user else ""))
    for grant in found:
        fixed = ", ".join(
            f"{k}={short(json.dumps(v, ensure_ascii=False), 30)}"
            for k, v in grant.constraint.fixed.items()
        )
        widened = f"; any {', '.join(grant.constraint.any)}" if grant.constraint.any else ""
        lapsed = "" if grants.in_force(rt, grant) else "  (not in force: policy or tool changed)"
        print(
            f"{grant.id}  {grant.tool:<16} for {grant.requester:<12} by {grant.grantor:<12} "
            f"{grant.scope:<6} until {when(grant.expires_at)}  used {grant.uses}  "
            f"{short(fixed, 60) or '-'}{widened}{lapsed}"
        )
    return 0


def cmd_grants_revoke(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    user = args.user or local_user()
    result = grants.revoke(rt, args.grant_id, by=user, roles=Access.of(rt).roles(user))
    if result == grants.RevokeResult.REVOKED:
        print(f"{args.grant_id}: revoked by {user}; it allows nothing more")
        return 0
    if result == grants.RevokeResult.NOT_ALLOWED:
        raise OperatorError(
            f"{user} may not revoke {args.grant_id}: only its grantor, the person it covers "
            "or an admin may; pass --user with one of them"
        )
    if result == grants.RevokeResult.ALREADY_ENDED:
        print(f"{args.grant_id}: already ended")
        return 1
    raise OperatorError(
        f"no grant {args.grant_id!r} (in this Redis: check REDIS_URL); "
        "`switchboard approvals grants list` shows those in force"
    )


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    if args.user:
        waiting = approvals.pending_for(rt, args.user, Access.of(rt).roles(args.user))
    else:
        waiting = approvals.pending(rt)
    if not waiting:
        print("no approvals waiting" + (f" for {args.user}" if args.user else ""))
    for request in sorted(waiting, key=lambda r: r.created_at):
        print(
            f"{request.id}  {when(request.created_at)}  {request.tool:<16} "
            f"asked by {request.requester:<14} run {request.run_id}  "
            f"{short(request.args, 60)}"
        )
    return 0


def cmd_show(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    request = _find(rt, args.approval_id)
    if args.json:
        body = {**request.to_hash(), "args": request.args, "cards": request.cards}
        print(json.dumps(body, indent=2, ensure_ascii=False))
        return 0
    print(f"Approval {request.id}: {request.status.value}")
    print(f"Tool: {request.tool}, asked by {request.requester} in run {request.run_id}")
    for line in json.dumps(request.args, indent=2, ensure_ascii=False).splitlines():
        print("  " + line)
    print(f"May decide: {approvals.facts(rt, request).approvers}")
    print(f"Asked {when(request.created_at)}; expires {when(request.expires_at)}")
    if request.decided:
        reason = f": {plain(request.reason)}" if request.reason else ""
        by = f" by {request.decided_by}" if request.decided_by else ""
        print(f"Decided{by} at {when(request.decided_at)}{reason}")
    else:
        print(f"Decide: switchboard approvals approve {request.id} (or reject --reason ...)")
    return 0


def cmd_decide(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    request = _find(rt, args.approval_id)
    user = args.user or local_user()
    outcome = service.decide(
        rt,
        request.id,
        decider_id=user,
        decider_roles=Access.of(rt).roles(user),
        approve=args.approve,
        reason=args.reason,
        edited_args=_edited(rt, request, getattr(args, "set", [])),
        instructions=getattr(args, "instructions", ""),
        surface="cli",
    )
    result = outcome.result
    if result == service.DecisionResult.INVALID_EDIT:
        why = outcome.refused.message if outcome.refused else "not allowed"
        field = f" ({outcome.refused.field})" if outcome.refused and outcome.refused.field else ""
        raise OperatorError(f"{request.id}: the edit is refused{field}: {why}; nothing was decided")
    if result == service.DecisionResult.DECIDED and outcome.request is not None:
        edited = " with edits" if outcome.request.edited else ""
        print(
            f"{request.id}: {outcome.request.status.value}{edited} by {user}; {_next(rt, request)}"
        )
        return 0
    if result == service.DecisionResult.NOT_ALLOWED:
        raise OperatorError(
            f"{user} may not decide {request.id} ({request.tool}) "
            f"(policy {Access.of(rt).source}); "
            f"it needs {outcome.approvers}: pass --user with one of them"
        )
    if result == service.DecisionResult.ALREADY_DECIDED and outcome.request is not None:
        done = outcome.request
        by = f" by {done.decided_by}" if done.decided_by else ""
        print(f"{request.id}: already {done.status.value}{by} at {when(done.decided_at)}")
        return 1
    raise _not_found(request.id)


def _edited(rt: Runtime, request: ApprovalRequest, assignments: list[str]) -> dict[str, Any] | None:
    """The arguments with every --set applied; None without any."""
    if not assignments:
        return None
    tool = approvals.facts(rt, request).tool
    properties = (tool.parameters.get("properties") or {}) if tool is not None else {}
    try:
        return with_assignments(request.args, properties, assignments)
    except EditInputError as exc:
        raise OperatorError(f"--set: {exc}") from None


def _next(rt: Runtime, request: ApprovalRequest) -> str:
    """What happens now: the run goes on, or, with no worker alive (by heartbeat, as
    `switchboard chat` checks), waits for one; nothing is lost either way."""
    from switchboard.supervise import live_workers

    show = f"`switchboard runs show {request.run_id}`"
    if live_workers(rt.queue):
        return f"run {request.run_id} goes on ({show})"
    return (
        f"run {request.run_id} waits for a worker: none is alive on queue {rt.queue.name!r} "
        f"(start one with `switchboard worker`; the run goes on when it does, {show})"
    )


def _find(rt: Runtime, approval_id: str) -> ApprovalRequest:
    request = approvals.find(rt, approval_id)
    if request is None:
        raise _not_found(approval_id)
    return request


def _not_found(approval_id: str) -> ApprovalNotFoundError:
    return ApprovalNotFoundError(
        f"no approval {approval_id!r} (in this Redis: check REDIS_URL); "
        "`switchboard approvals list` shows those waiting"
    )
