"""Who may call which tool, on which argument values, and who may approve it.

A policy maps roles to Slack users and user groups, and tools to rules. It is
loaded at start-up (`SWITCHBOARD_POLICY`), and again when the file changes
(worker/policy_watch.py); a bad file fails with a message naming the file, the
line and what to fix. Nothing the model writes can change it.

Without a file, reads are for everyone and writes for everyone, approved by the
requester. With a file, what it does not grant is denied: a tool it names
neither by name, nor by pattern, nor through `defaults:` is not offered to the
model and not run (`disabled_tools` lists them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from tools.decode import canonical_json
from tools.exceptions import PolicyError
from tools.patterns import most_specific
from tools.policy_file import (
    EFFECTS,
    EVERYONE,
    EXTERNAL,
    REQUESTER,
    PolicyContent,
    RuleFields,
    default_rules,
    read_policy,
)
from tools.profiles import DM, Profile
from tools.registry import ToolRegistry

__all__ = ["EVERYONE", "EXTERNAL", "REQUESTER", "Denial", "Policy", "PolicyError", "ToolRule"]

log = structlog.get_logger(__name__)

DEFAULT_SOURCE = "<default policy>"


@dataclass(frozen=True)
class ToolRule:
    """The effective rule for one tool (its own entry merged over the defaults)."""

    allow: tuple[str, ...]
    approvers: tuple[str, ...] = ()
    self_approval: bool = False
    high_risk: bool = False
    constraints: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    remind_after: float | None = None  # seconds a request waits before approvers get a DM
    remind_every: float | None = None  # then again every so many seconds ...
    remind_limit: int = 3  # ... up to this many reminders for one card in all
    escalate_to: tuple[str, ...] = ()  # roles that may decide too, after escalate_after
    escalate_after: float | None = None
    grants: tuple[str, ...] = ()  # standing grants an approver may make (GRANT_SCOPES)
    self_grants: bool = False  # may a requester who self-approves grant for themselves?

    @classmethod
    def from_fields(cls, fields: RuleFields) -> ToolRule:
        return cls(
            allow=fields["allow"],
            approvers=fields["approvers"],
            self_approval=fields["self_approval"],
            high_risk=fields["high_risk"],
            constraints=MappingProxyType(dict(fields["constraints"])),
            remind_after=fields.get("remind_after"),
            remind_every=fields.get("remind_every"),
            remind_limit=int(fields.get("remind_limit", 3)),
            escalate_to=tuple(fields.get("escalate_to", ())),
            escalate_after=fields.get("escalate_after"),
            grants=tuple(fields.get("grants", ())),
            self_grants=bool(fields.get("self_grants", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "allow": list(self.allow),
            "approvers": list(self.approvers),
            "self_approval": self.self_approval,
            "high_risk": self.high_risk,
            "constraints": {name: list(values) for name, values in self.constraints.items()},
            **({"remind_after": self.remind_after} if self.remind_after is not None else {}),
            **(
                {"remind_every": self.remind_every, "remind_limit": self.remind_limit}
                if self.remind_every is not None
                else {}
            ),
            **({"escalate_to": list(self.escalate_to)} if self.escalate_to else {}),
            **({"escalate_after": self.escalate_after} if self.escalate_after is not None else {}),
            # only when set: a policy without grants keeps the version it had
            **({"grants": list(self.grants)} if self.grants else {}),
            **({"self_grants": True} if self.self_grants else {}),
        }


NO_RULE = ToolRule(allow=())  # a tool the policy file does not grant: nobody may call it


@dataclass(frozen=True)
class Denial:
    """Why a call is not allowed, worded for the model to read."""

    reason: str
    # The argument a constraint refused, if one did (for forms that name the field);
    # not part of what a denial says, so not of its equality.
    argument: str | None = field(default=None, compare=False)


class Policy:
    """Roles, admins and tool rules, checked against the tools in a registry."""

    def __init__(self, content: PolicyContent, registry: ToolRegistry, source: str) -> None:
        self.registry = registry
        self.source = source
        self.roles: Mapping[str, frozenset[str]] = MappingProxyType(dict(content.roles))
        self.admins: tuple[str, ...] = content.admins
        self.approvals_channel: str | None = content.approvals_channel
        # Only the effects granted to tools the policy does not name (see PolicyContent).
        self.defaults = {
            effect: ToolRule.from_fields(fields)
            for effect, fields in content.defaults.items()
            if effect in content.default_grants
        }
        self.tools = {name: ToolRule.from_fields(fields) for name, fields in content.tools.items()}
        self.patterns: tuple[tuple[str, Mapping[str, ToolRule]], ...] = tuple(
            (
                entry.pattern,
                MappingProxyType({e: ToolRule.from_fields(f) for e, f in entry.rules.items()}),
            )
            for entry in content.patterns
        )
        self._pattern_rules = dict(self.patterns)
        self.lines: Mapping[str, int] = MappingProxyType(dict(content.lines))
        # Per-person limits the file sets (`limits:`); the rest come from the settings.
        self.limits: Mapping[str, float] = MappingProxyType(dict(content.limits))
        self.high_risk_entries = frozenset(content.high_risk_entries)
        self.warnings: tuple[str, ...] = tuple(content.warnings)
        self.profiles: Mapping[str, Profile] = MappingProxyType(dict(content.profiles))
        self._channel_profiles = {c: p for p in self.profiles.values() for c in p.channels}
        self.version = hashlib.sha256(canonical_json(self.to_json()).encode()).hexdigest()[:12]

    # -- constructors ---------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, registry: ToolRegistry) -> Policy:
        """Read a policy YAML file; raise PolicyError naming the file, line and fix."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyError(f"{source}: policy file not found (SWITCHBOARD_POLICY)") from None
        except (OSError, UnicodeDecodeError) as error:
            raise PolicyError(f"{source}: cannot read the policy file: {error}") from None
        return cls.parse(text, registry, source=source)

    @classmethod
    def parse(cls, text: str, registry: ToolRegistry, *, source: str = "policy.yaml") -> Policy:
        """Build a policy from YAML text; `source` names it in error messages."""
        policy = cls(read_policy(text, source, registry), registry, source)
        log.info(
            "policy_loaded",
            source=source,
            version=policy.version,
            tools=len(policy.tools),
            patterns=len(policy.patterns),
            defaults=sorted(policy.defaults),
        )
        for warning in policy.warnings:
            log.warning("policy_warning", warning=warning)
        disabled = policy.disabled_tools()
        if disabled:
            log.warning(
                "policy_tools_disabled", source=source, count=len(disabled), first=disabled[:5]
            )
        return policy

    @classmethod
    def default(cls, registry: ToolRegistry) -> Policy:
        """No file: reads for everyone; writes for everyone, approved by the requester."""
        content = PolicyContent(defaults=default_rules(), default_grants=frozenset(EFFECTS))
        return cls(content, registry, DEFAULT_SOURCE)

    @property
    def is_default(self) -> bool:
        """True when no policy file was given (the out-of-the-box rules apply)."""
        return self.source == DEFAULT_SOURCE

    # -- identity -------------------------------------------------------------

    def roles_for(self, user_id: str, groups: Iterable[str] = ()) -> frozenset[str]:
        """The roles of a Slack user who belongs to the given user groups ("@handle")."""
        handles = {_handle(group) for group in groups}
        held = {
            role
            for role, members in self.roles.items()
            if user_id in members or not handles.isdisjoint(members)
        }
        return frozenset({EVERYONE, *held})

    # -- profiles -------------------------------------------------------------

    def profile_for(self, channel_id: str) -> Profile | None:
        """The profile of a conversation: the one naming the channel; for a DM (a `D…`
        channel nobody names) the profile called `dm`; else None (the defaults)."""
        named = self._channel_profiles.get(channel_id)
        if named is None and channel_id.startswith("D"):
            return self.profiles.get(DM)
        return named

    # -- calling --------------------------------------------------------------

    def rule(self, tool_name: str) -> ToolRule:
        """The effective rule for a tool; KeyError for a name the registry does not know.

        A tool the policy grants no rule gets NO_RULE: nobody may call or approve it.
        """
        return self._lookup(tool_name)[0]

    def rule_source(self, tool_name: str) -> str | None:
        """Where a tool's rule comes from: "tools.NAME", "tools.PATTERN" or "defaults.EFFECT";
        None when the policy grants it no rule. KeyError for an unknown tool."""
        return self._lookup(tool_name)[1]

    def _lookup(self, tool_name: str) -> tuple[ToolRule, str | None]:
        """The most specific entry wins: an exact name, then the most specific matching
        pattern, then the defaults. A tool declared high risk (an MCP server's
        destructiveHint) stays high risk unless its entry sets `high_risk` itself."""
        tool = self.registry.get(tool_name)
        if tool_name in self.tools:
            rule, source = self.tools[tool_name], f"tools.{tool_name}"
        elif tool is None:
            raise KeyError(f"unknown tool {tool_name!r}")
        elif (pattern := most_specific(self._pattern_rules, tool_name)) is not None:
            rule, source = self._pattern_rules[pattern][tool.effect], f"tools.{pattern}"
        elif tool.effect in self.defaults:
            rule, source = self.defaults[tool.effect], f"defaults.{tool.effect}"
        else:
            return NO_RULE, None
        declared = tool is not None and tool.high_risk and tool.effect == "write"
        if declared and not rule.high_risk and source not in self.high_risk_entries:
            rule = dataclasses.replace(rule, high_risk=True, grants=(), self_grants=False)
        return rule, source

    def allowed_tools(self, roles: Iterable[str]) -> list[str]:
        """Names of the tools these roles may call, in registry order."""
        held = held_roles(roles)
        return [
            name for name in self.registry.names() if not held.isdisjoint(self.rule(name).allow)
        ]

    def disabled_tools(self) -> list[str]:
        """Registered tools the policy file grants no rule, in registry order."""
        return [name for name in self.registry.names() if self.rule_source(name) is None]

    def disabled_summary(self) -> str | None:
        """One line for people about the tools disabled for lack of a rule; None if none."""
        disabled = self.disabled_tools()
        if not disabled:
            return None
        shown = ", ".join(disabled[:5])
        if len(disabled) > 5:
            shown += f" and {len(disabled) - 5} more"
        return (
            f"{len(disabled)} of {len(self.registry)} tools are disabled because {self.source} "
            f"grants them no rule: {shown}. Add them under `tools:` (names or patterns like "
            "'git_*') or grant a whole effect under `defaults:`; `switchboard tools` lists all."
        )

    def authorize_caller(self, tool_name: str, roles: Iterable[str]) -> Denial | None:
        """None if these roles may call the tool at all (arguments aside), else a Denial."""
        try:
            rule, source = self._lookup(tool_name)
        except KeyError:
            return Denial(f"You may not call {tool_name}: there is no such tool.")
        if source is None:
            return Denial(
                f"You may not call {tool_name}: the policy file grants no rule for "
                f"{tool_name}; ask an admin to add it under `tools:`."
            )
        if held_roles(roles).isdisjoint(rule.allow):
            if not rule.allow:
                return Denial(f"You may not call {tool_name}: it is disabled by policy.")
            return Denial(f"You may not call {tool_name}: it is limited to {_or(rule.allow)}.")
        return None

    def authorize(
        self, tool_name: str, roles: Iterable[str], args: Mapping[str, Any]
    ) -> Denial | None:
        """None if the call is allowed, else a Denial the model can read."""
        denial = self.authorize_caller(tool_name, roles)
        if denial is not None:
            return denial
        rule = self.rule(tool_name)
        for name, allowed in rule.constraints.items():
            if not _is_allowed(args.get(name), allowed, name in args):
                return Denial(f"{name} must be one of {_values(allowed)}", name)
        return None

    # -- approving ------------------------------------------------------------

    def approvers_text(self, tool_name: str) -> str:
        """Who may approve, for people: "the requester or @admins"."""
        try:
            rule, source = self._lookup(tool_name)
        except KeyError:
            return "nobody"
        if source is None:
            return "nobody (the policy grants it no rule)"
        approvers = rule.approvers
        if not approvers:
            return "nobody (it needs no approval)"
        names = [_approver_name(approver) for approver in approvers]
        return _or(names)

    # -- inspection -----------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The effective policy content; `version` is a hash of this."""
        content: dict[str, Any] = {
            "roles": {role: sorted(members) for role, members in sorted(self.roles.items())},
            "admins": sorted(self.admins),
            "approvals_channel": self.approvals_channel,
            "defaults": {effect: rule.to_json() for effect, rule in sorted(self.defaults.items())},
            "tools": {name: rule.to_json() for name, rule in sorted(self.tools.items())},
            "patterns": [  # sorted: the most specific match applies, whatever the file's order
                {"pattern": pattern, **{e: rule.to_json() for e, rule in sorted(rules.items())}}
                for pattern, rules in sorted(self.patterns)
            ],
        }
        if self.profiles:  # only then: a file without profiles keeps the version it had
            content["profiles"] = {name: p.to_json() for name, p in sorted(self.profiles.items())}
        return content

    def __repr__(self) -> str:
        return f"Policy(source={self.source!r}, version={self.version!r})"


def held_roles(roles: Iterable[str]) -> frozenset[str]:
    """Everyone holds `everyone`, except people from another organisation (`external`):
    they hold only what the policy gives them by name."""
    held = frozenset(roles)
    return held if EXTERNAL in held else held | {EVERYONE}


def _handle(group: str) -> str:
    group = group.strip().lower()
    return group if group.startswith("@") else "@" + group


def _is_allowed(value: Any, allowed: tuple[Any, ...], present: bool) -> bool:
    if not present:
        return False
    try:
        text = canonical_json(value)
    except (TypeError, ValueError):
        return False
    return any(canonical_json(item) == text for item in allowed)


def _values(values: Iterable[Any]) -> str:
    shown = [v if isinstance(v, str) else json.dumps(v) for v in list(values)[:12]]
    return ", ".join(shown)


def _approver_name(approver: str) -> str:
    if approver == REQUESTER:
        return "the requester"
    if approver == EVERYONE:
        return "anyone"
    return "@" + approver


def _or(names: Iterable[str]) -> str:
    items = list(names)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]
