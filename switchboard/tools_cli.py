"""`switchboard tools [check|accept SERVER] [--profile NAME] [--json]`: every registered
tool, where it comes from and what the policy grants it.

`tools` lists each tool with its effect, where it comes from (a module, or an MCP server),
the policy entry that applies to it, who may call it and who approves it; a tool the policy
file does not grant is shown as disabled. `tools check` loads every tool source (imports
the modules, connects to the MCP servers and lists their tools) and validates the policy
file against the tools: it exits 1 with one line per problem (the same ones that stop
start-up) and prints warnings (a pattern that matches no tool) without failing.
`--profile NAME` lists only the tools that profile keeps (each still only for the people
its rule allows).

With MCP servers, each listing is checked against the one recorded for the deployment
in Redis (tools/mcp/pins.py): a server whose listing changed has all its tools shown, and
used, as writes. `tools accept SERVER` records the server's current listing instead, once
the operator has looked at the change; processes started after that use it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from switchboard import logs
from switchboard.errors import CliError
from switchboard.redisconn import connect
from switchboard.settings import Config
from switchboard.verbs import help_of
from switchboard.wiring import (
    check_tools,
    load_policy,
    load_tools,
    mcp_pins,
    profile_demo_problems,
)
from tools.exceptions import OperatorError, PolicyError
from tools.policy import Policy
from tools.profiles import Profile
from tools.registry import registry
from worker.profiles import named

if TYPE_CHECKING:
    from tools.mcp import McpServers

# -- what the operator reads ------------------------------------------------------

CHECK_HELP = "`check` loads every tool source and validates the policy file against the tools"
NO_FILE = "none (SWITCHBOARD_POLICY is unset): the built-in defaults apply"
BUILT_IN = "built-in default"
DISABLED = "disabled: no rule in {source}"
NOBODY = "nobody"
NO_APPROVAL = "-"
HIGH_RISK = "high risk"
ACTS_AS = "acts as the person asking ({connection})"
LIMITS = "limits {names}"
HEADER = ("TOOL", "EFFECT", "FROM", "RULE", "MAY CALL", "APPROVERS", "NOTES")
NO_TOOLS = "no tools are registered (check SWITCHBOARD_TOOLS and SWITCHBOARD_MCP)"
MCP_LINE = "mcp: {file}: {servers}"
MCP_SERVER = "{key} ({transport}, {count} tools)"
TRANSPORTS = {"stdio": "stdio", "http": "streamable HTTP"}
CHECK_MCP = "ok: {where}: connected over {transport}, {count} tools ({target})"
CHECK_OK_DEFAULT = (
    "ok: no policy file (SWITCHBOARD_POLICY is unset); the built-in defaults apply: "
    "reads for everyone, writes approved by the requester"
)
CHECK_OK = "ok: {source} grants {granted} of {total} registered tools"
CHECK_NOT_CHECKED = "the policy file was not checked: fix the tool sources first"
CHECK_FAIL = "FAIL {problem}"
CHECK_WARNING = "warning: {warning}"
CHECK_NOTE = "note: {summary}"
PROFILE_HELP = "only the tools this profile (policy file `profiles:`) keeps"
PROFILES_LINE = "profiles: {profiles}"
PROFILE_ENTRY = "{name} ({channels})"
PROFILE_HEAD = (
    "profile: {name} ({source} line {line}); channels: {channels}; model: {model}; tools: {tools}"
)
ACCEPT_HELP = "`accept SERVER` records an MCP server's current tool listing as the deployment's"
SERVER_HELP = "with `accept`: the MCP server, by its key in SWITCHBOARD_MCP"
CHANGED = "{key}: listing changed, all writes"
CHANGED_NOTE = "MCP listing changed: a write until `switchboard tools accept {key}`"
CHECK_CHANGED = (
    "warning: {where}: {reason} (tools: {tools}), so every tool of it is a high-risk write "
    "(except those `effects:` pins); if the change is expected, run `switchboard tools accept "
    "{key}` and restart the bot and workers"
)
ACCEPT_NO_FILE = "`tools accept` needs SWITCHBOARD_MCP, the MCP servers file"
ACCEPT_WHICH = "say which MCP server to accept: switchboard tools accept SERVER (one of: {keys})"
ACCEPT_UNKNOWN = "{file} has no MCP server {key!r} (it has: {keys})"
ACCEPT_UNSTABLE = (
    "MCP server {key!r} cannot be accepted: {reason} (tools: {tools}); a listing that changes "
    "cannot be recorded: fix the server, or pin its tools with `effects:`"
)
ACCEPTED = (
    "accepted: {where}: its current listing ({count} tools) is recorded for the deployment{was}; "
    "restart the bot and workers so every process uses it"
)
ACCEPTED_CHANGED = "; changed since the last record: {tools}"
PROFILE_ALL_TOOLS = "every tool the user may call"
PROFILE_DEFAULT_MODEL = "the configured one"
NO_CHANNELS = "no channels"


def add_command(verbs: Any) -> None:
    p = verbs.add_parser("tools", help=help_of("tools"), description=__doc__)
    p.set_defaults(handler=cmd_tools)
    p.add_argument(
        "action", nargs="?", choices=["check", "accept"], help=f"{CHECK_HELP}; {ACCEPT_HELP}"
    )
    p.add_argument("server", nargs="?", help=SERVER_HELP)
    p.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_tools(config: Config, args: argparse.Namespace) -> int:
    logs.configure(config.log_format, logging.ERROR)  # the output says what the log lines would
    if args.action == "check":
        return cmd_check(config, args)
    if args.action == "accept":
        return cmd_accept(config, args)
    return cmd_list(config, args)


def mcp_redis(config: Config) -> redis.Redis | None:
    """Redis, where MCP listings are recorded; needed only when there are MCP servers."""
    return connect(config.redis_url) if config.mcp else None


def cmd_list(config: Config, args: argparse.Namespace) -> int:
    try:
        servers = load_tools(config, mcp_redis(config))
    except OperatorError as exc:  # as at start-up; `tools check` reports it as a failure
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    policy = load_policy(config)  # a PolicyError is printed by main(), naming the lines
    profile = named(policy, args.profile) if args.profile else None  # unknown: exit 2
    names = profile.narrow(registry.names()) if profile else registry.names()
    rows = [tool_entry(policy, name, changed_notes(servers)) for name in names]
    if args.json:
        listing = listing_json(policy, rows, servers)
        listing["profile"] = profile_json(profile) if profile else None
        print(json.dumps(listing, indent=2))
        return 0
    print("policy: " + (NO_FILE if policy.is_default else f"{policy.source} ({policy.version})"))
    if profile is not None:
        print(profile_head(policy, profile))
    elif policy.profiles:
        print(profiles_line(policy))
    if servers is not None:
        print(mcp_line(config, servers))
    if not rows:
        print(NO_TOOLS)
        return 0
    print(table([HEADER, *(text_row(policy, row) for row in rows)]))
    for warning in policy.warnings:
        print(CHECK_WARNING.format(warning=warning))
    summary = policy.disabled_summary()
    if summary:
        print(summary)
    return 0


def cmd_check(config: Config, args: argparse.Namespace) -> int:
    """Reports every problem instead of stopping at the first, like `demos check`."""
    servers, errors = check_tools(config, mcp_redis(config))
    tools_loaded = not errors
    policy = None
    if tools_loaded:
        try:
            policy = load_policy(config)
        except PolicyError as exc:
            errors = str(exc).splitlines()
        else:
            errors = profile_demo_problems(policy)
    if args.json:
        print(json.dumps(check_json(policy, errors, config.policy or None, servers), indent=2))
        return 1 if errors else 0
    for line in [*server_lines(servers), *changed_lines(servers)]:
        print(line)
    for problem in errors:
        print(CHECK_FAIL.format(problem=problem))
    if policy is None:
        if config.policy and not tools_loaded:
            print(CHECK_NOTE.format(summary=CHECK_NOT_CHECKED))
        return 1
    for warning in policy.warnings:
        print(CHECK_WARNING.format(warning=warning))
    summary = policy.disabled_summary()
    if summary:
        print(CHECK_NOTE.format(summary=summary))
    if errors:
        return 1
    if policy.is_default:
        print(CHECK_OK_DEFAULT)
    else:
        total = len(registry)
        granted = total - len(policy.disabled_tools())
        print(CHECK_OK.format(source=policy.source, granted=granted, total=total))
    return 0


def cmd_accept(config: Config, args: argparse.Namespace) -> int:
    """Record an MCP server's current listing for the deployment, replacing the old record
    and clearing the mark a changed listing left (tools/mcp/pins.py)."""
    from tools.mcp import McpServers

    if not config.mcp:
        raise CliError(ACCEPT_NO_FILE)
    keys = list(McpServers.from_file(config.mcp).connections)
    if not args.server:
        raise CliError(ACCEPT_WHICH.format(keys=", ".join(keys)))
    if args.server not in keys:
        raise CliError(
            ACCEPT_UNKNOWN.format(file=config.mcp, key=args.server, keys=", ".join(keys))
        )
    connection = connect(config.redis_url)
    pins = mcp_pins(connection)
    assert pins is not None
    before = pins.recorded(args.server)
    pins.forget(args.server)
    servers = load_tools(config, connection)
    assert servers is not None
    [server] = [s for s in servers.servers if s.config.key == args.server]
    if server.verdict.differs:
        pins.forget(args.server)  # nothing trustworthy to keep: the next start records again
        raise CliError(
            ACCEPT_UNSTABLE.format(
                key=args.server,
                reason=server.verdict.reason,
                tools=", ".join(server.verdict.differing),
            )
        )
    now = pins.recorded(args.server) or {}
    changed = (
        sorted(n for n in before.keys() | now.keys() if before.get(n) != now.get(n))
        if before
        else []
    )
    was = ACCEPTED_CHANGED.format(tools=", ".join(changed[:20])) if changed else ""
    print(ACCEPTED.format(where=server.config.where, count=len(now), was=was))
    return 0


# -- profiles ---------------------------------------------------------------------


def profiles_line(policy: Policy) -> str:
    entries = (
        PROFILE_ENTRY.format(name=p.name, channels=", ".join(p.channels) or NO_CHANNELS)
        for p in policy.profiles.values()
    )
    return PROFILES_LINE.format(profiles="; ".join(entries))


def profile_head(policy: Policy, profile: Profile) -> str:
    return PROFILE_HEAD.format(
        name=profile.name,
        source=policy.source,
        line=profile.line,
        channels=", ".join(profile.channels) or NO_CHANNELS,
        model=profile.model or PROFILE_DEFAULT_MODEL,
        tools=PROFILE_ALL_TOOLS if profile.tools is None else ", ".join(profile.tools),
    )


def profile_json(profile: Profile) -> dict[str, Any]:
    return {"name": profile.name, "line": profile.line, **profile.to_json()}


# -- one tool ---------------------------------------------------------------------


def tool_entry(policy: Policy, name: str, changed: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the listing shows about one registered tool, as JSON values."""
    tool = registry.get(name)
    assert tool is not None
    rule, source = policy.rule(name), policy.rule_source(name)
    return {
        "name": name,
        "effect": tool.effect,
        "source": tool.source,
        "rule": (BUILT_IN if policy.is_default else source) if source else None,
        "line": policy.lines.get(source) if source else None,
        "disabled": source is None,
        **rule.to_json(),  # NO_RULE when disabled: nobody may call it
        # only for a tool whose MCP server's listing changed: its server's key
        **({"listing_changed": changed[name]} if changed and name in changed else {}),
        # only for a per-user tool: the provider whose connection it calls with
        **({"connection": tool.connection} if tool.connection else {}),
    }


def text_row(policy: Policy, entry: dict[str, Any]) -> tuple[str, ...]:
    name, effect, origin = entry["name"], entry["effect"], entry["source"]
    if entry["disabled"]:
        disabled = DISABLED.format(source=Path(policy.source).name)  # the path is on top
        return (name, effect, origin, disabled, NOBODY, NO_APPROVAL, "")
    rule = entry["rule"] + (f" (line {entry['line']})" if entry["line"] else "")
    approvers = policy.approvers_text(name) if effect == "write" else NO_APPROVAL
    notes = []
    if entry.get("listing_changed"):
        notes.append(CHANGED_NOTE.format(key=entry["listing_changed"]))
    if entry["high_risk"] and effect == "write":
        notes.append(HIGH_RISK)
    if entry["constraints"]:
        notes.append(LIMITS.format(names=", ".join(entry["constraints"])))
    if entry.get("connection"):
        notes.append(ACTS_AS.format(connection=entry["connection"]))
    allow = ", ".join(entry["allow"]) or NOBODY
    return (name, effect, origin, rule, allow, approvers, "; ".join(notes))


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


# -- MCP servers ----------------------------------------------------------------------


def mcp_line(config: Config, servers: McpServers) -> str:
    described = ", ".join(
        MCP_SERVER.format(
            key=s.config.key, transport=TRANSPORTS[s.config.transport], count=len(s.tools)
        )
        for s in servers.servers
    )
    changed = [CHANGED.format(key=s.config.key) for s in servers.servers if s.verdict.differs]
    return MCP_LINE.format(file=config.mcp, servers=described) + "".join(
        f"; {line}" for line in changed
    )


def changed_notes(servers: McpServers | None) -> dict[str, str]:
    """Tool name -> its server's key, for the tools that are writes because their server's
    listing changed (not those `effects:` pins)."""
    if servers is None:
        return {}
    return {
        tool.name: s.config.key
        for s in servers.servers
        if s.verdict.differs
        for tool in s.tools
        if tool.name not in {s.config.tool_name(n) for n in s.config.effects}
    }


def changed_lines(servers: McpServers | None) -> list[str]:
    if servers is None:
        return []
    return [
        CHECK_CHANGED.format(
            where=s.config.where,
            reason=s.verdict.reason,
            tools=", ".join(s.verdict.differing) or "-",
            key=s.config.key,
        )
        for s in servers.servers
        if s.verdict.differs
    ]


def server_lines(servers: McpServers | None) -> list[str]:
    if servers is None:
        return []
    return [
        CHECK_MCP.format(
            where=s.config.where,
            transport=TRANSPORTS[s.config.transport],
            count=len(s.tools),
            target=s.config.target,
        )
        for s in servers.servers
    ]


def servers_json(servers: McpServers | None) -> list[dict[str, Any]]:
    if servers is None:
        return []
    return [
        {
            "server": s.config.key,
            "transport": s.config.transport,
            "target": s.config.target,
            "line": s.config.line,
            "tools": [tool.name for tool in s.tools],
            "listing": s.verdict.state,
            "listing_changed": list(s.verdict.differing),
        }
        for s in servers.servers
    ]


# -- machine-readable ---------------------------------------------------------------


def policy_json(policy: Policy) -> dict[str, Any]:
    return {"file": None if policy.is_default else policy.source, "version": policy.version}


def listing_json(
    policy: Policy, rows: list[dict[str, Any]], servers: McpServers | None
) -> dict[str, Any]:
    return {
        "policy": policy_json(policy),
        "mcp": servers_json(servers),
        "tools": rows,
        "disabled": policy.disabled_tools(),
        "warnings": list(policy.warnings),
    }


def check_json(
    policy: Policy | None, errors: list[str], file: str | None, servers: McpServers | None
) -> dict[str, Any]:
    return {
        "ok": not errors,
        "policy": policy_json(policy) if policy else {"file": file, "version": None},
        "mcp": servers_json(servers),
        "errors": errors,
        "warnings": list(policy.warnings) if policy else [],
        "disabled": policy.disabled_tools() if policy else [],
    }
