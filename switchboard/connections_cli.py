"""`switchboard connections list|revoke|rekey`: a person's connections (never their tokens),
disconnecting one as the operator (revoked at the provider where it has an endpoint), and
rewriting every stored connection with the first key after a key rotation."""

from __future__ import annotations

import argparse
import time
from typing import Any

from switchboard import errors
from switchboard.errors import CliError
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import open_runtime
from worker.connections.store import FLOW_SECONDS, PENDING_SECONDS
from worker.service import connections


def add_command(verbs: Any) -> None:
    parser = verbs.add_parser(
        "connections", help=help_of("connections"), description=help_of("connections")
    )
    parser.set_defaults(handler=lambda c, a: _usage(parser))
    actions = parser.add_subparsers(title="connections commands", metavar="ACTION")
    p = actions.add_parser("list", help="a person's connected accounts (no tokens)")
    p.set_defaults(handler=cmd_list)
    p.add_argument("user", metavar="USER", help="the Slack user id")
    p.add_argument("--team", default="", metavar="T", help="their workspace id")
    p = actions.add_parser("revoke", help="disconnect a person's account for a provider")
    p.set_defaults(handler=cmd_revoke)
    p.add_argument("user", metavar="USER", help="the Slack user id")
    p.add_argument("provider", metavar="PROVIDER", help="e.g. github, mcp:docs")
    p.add_argument("--team", default="", metavar="T", help="their workspace id")
    p = actions.add_parser(
        "rekey",
        help="after putting a new key first in SWITCHBOARD_CONNECTION_KEYS: rewrite every "
        "stored connection with it, so the old keys can be removed",
    )
    p.set_defaults(handler=cmd_rekey)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    found = connections.listing(rt, args.team, args.user)
    if not found:
        print(f"{args.user} has no connections")
        return 0
    for item in found:
        since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(item.connected_at))
        print(f"{item.provider}\t{item.label}\tconnected {since}\tscope {item.scope or '-'}")
    return 0


def cmd_revoke(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    if not connections.revoke(rt, args.team, args.user, args.provider):
        raise CliError(f"{args.user} has no {args.provider} connection")
    print(f"{args.user}: {args.provider} disconnected")
    return 0


def cmd_rekey(config: Config, args: argparse.Namespace) -> int:
    rt = open_runtime(config)
    if rt.connections is None:
        raise CliError("connections are not set up here: SWITCHBOARD_CONNECTION_KEYS is unset")
    where = errors.redact_url(config.redis_url) if config.redis_url else "the embedded Redis"
    print(f"Redis: {where}")
    done = rt.connections.store.rekey()
    print(
        f"rewrote {done.grants} connection(s) and {done.clients} registered client(s) with "
        "the first key of SWITCHBOARD_CONNECTION_KEYS"
    )
    fine = True
    if done.grants + done.clients + done.unreadable_grants + done.unreadable_clients == 0:
        print(
            "found no connection here: if people have connected, this is not the deployment's "
            "Redis (REDIS_URL); keep the old keys"
        )
        fine = False
    if done.busy:
        print(f"{done.busy} connection(s) were being refreshed throughout: run rekey again")
        fine = False
    if done.unreadable_grants:
        print(
            f"{done.unreadable_grants} connection(s) open with none of the configured keys "
            "(sealed with a key already removed): left as they are; those people connect again"
        )
        fine = False
    if done.unreadable_clients:
        print(
            f"{done.unreadable_clients} registered client(s) open with none of the configured "
            "keys: every connection to that MCP server fails at its next refresh; put the "
            "removed key back and run rekey again"
        )
        fine = False
    if fine:
        print(
            "the other keys may be removed once connects started before now have finished "
            f"(give it {max(FLOW_SECONDS, PENDING_SECONDS) // 60} minutes)"
        )
    return 0 if fine else 1
