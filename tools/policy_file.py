"""Reading a policy YAML file into checked, merged rule fields.

The file is composed (not just loaded) so every error can name the line it
comes from: "policy.yaml line 12: unknown tool 'x' ...". Reading goes on after
an error so one run reports every problem in the file.

A file grants only what it names: a tool under `tools:` (by its name, or by a
shell-style pattern like "git_*" for tools that come in bulk), or every tool of
an effect through `defaults: {read: ..., write: ...}`. Fields a rule leaves out
come from `defaults:`, then from the built-in defaults.

The most specific entry wins, whatever the order in the file: a tool's own name
beats every pattern, and of two patterns that match it the more specific one
applies (see `tools.patterns`). Two equally specific patterns that both match a
registered tool without an entry of its own are an error naming both lines.

Why ~500 lines in one module: it is one reader of one file format, section by section
(`_Reader`), and every section's checks share its state (known roles, lines, warnings).
The format-independent parts live elsewhere: pattern specificity in `tools/patterns.py`,
node reading in `tools/yaml_nodes.py`, profiles in `tools/profiles.py`.
"""

from __future__ import annotations

import re
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import yaml
from jsonschema import Draft202012Validator

from tools.exceptions import PolicyError
from tools.patterns import is_pattern, most_specific, pattern_matches, specificity
from tools.profiles import Profile, read_profiles
from tools.registry import ToolRegistry
from tools.yaml_nodes import Invalid as _Invalid
from tools.yaml_nodes import NodeReader, compose
from tools.yaml_nodes import is_null as _is_null
from tools.yaml_nodes import suggest as _suggest

EVERYONE = "everyone"
EXTERNAL = "external"  # people from another organisation (Slack Connect): never `everyone`
REQUESTER = "requester"

TOP_LEVEL_KEYS = (
    "roles",
    "admins",
    "approvals_channel",
    "limits",
    "tools",
    "defaults",
    "profiles",
)
# Per person; 0 is no limit. Values above these are surely typos.
LIMIT_BOUNDS: dict[str, tuple[type, float]] = {
    "runs_in_flight": (int, 1000),
    "runs_per_minute": (int, 10_000),
    "cost_per_day": (float, 1_000_000.0),
}
WRITE_ONLY_KEYS = (
    "approvers",
    "self_approval",
    "high_risk",
    "remind_after",
    "remind_every",
    "remind_limit",
    "escalate_to",
    "escalate_after",
    "grants",
    "self_grants",
)
MIN_REMIND_EVERY = 60.0  # seconds: one DM a person a minute is the surface's cap anyway
MAX_REMINDERS = 20  # reminders one card gets in all, at most
# Standing grants an approver may make for a tool (worker/service/grants.py): the call's
# thread for up to a day, or any thread for an hour or a day.
GRANT_SCOPES = ("thread", "hour", "day")
TOOL_KEYS = {"read": ("allow", "constraints"), "write": ("allow", *WRITE_ONLY_KEYS, "constraints")}
DEFAULT_KEYS = {"read": ("allow",), "write": ("allow", *WRITE_ONLY_KEYS)}
PATTERN_KEYS = ("allow", *WRITE_ONLY_KEYS)  # the write-only keys apply to the writes it matches
EFFECTS = ("read", "write")

_PATTERN = re.compile(r"^[A-Za-z0-9_\-*?\[\]!]{1,128}$")

_ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_USER_ID = re.compile(r"^[UW][A-Z0-9]+$")
_GROUP_HANDLE = re.compile(r"^@[a-z0-9][a-z0-9._-]{0,79}$")
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,}$")

Node = yaml.Node


class RuleFields(TypedDict):
    allow: tuple[str, ...]
    approvers: tuple[str, ...]
    self_approval: bool
    high_risk: bool
    constraints: dict[str, tuple[Any, ...]]
    remind_after: NotRequired[float | None]
    escalate_to: NotRequired[tuple[str, ...]]
    escalate_after: NotRequired[float | None]
    grants: NotRequired[tuple[str, ...]]
    self_grants: NotRequired[bool]
    remind_every: NotRequired[float | None]
    remind_limit: NotRequired[int]


def default_rules() -> dict[str, RuleFields]:
    """Reads for everyone; writes for everyone, approved by the requester themselves."""
    read = RuleFields(
        allow=(EVERYONE,), approvers=(), self_approval=False, high_risk=False, constraints={}
    )
    write = RuleFields(
        allow=(EVERYONE,),
        approvers=(REQUESTER,),
        self_approval=True,
        high_risk=False,
        constraints={},
    )
    return {"read": read, "write": write}


@dataclass(frozen=True)
class PatternRule:
    """A `tools:` entry whose key is a pattern: one merged rule per effect."""

    pattern: str
    line: int
    rules: dict[str, RuleFields]


@dataclass
class PolicyContent:
    roles: dict[str, frozenset[str]] = field(default_factory=dict)
    admins: tuple[str, ...] = ()
    approvals_channel: str | None = None
    # The base every rule is merged over: the built-in defaults, then the file's `defaults:`.
    defaults: dict[str, RuleFields] = field(default_factory=default_rules)
    # Effects whose default rule applies to tools the file does not name. A file grants
    # only the effects it lists under `defaults:`; no file (Policy.default) grants both.
    default_grants: frozenset[str] = frozenset()
    tools: dict[str, RuleFields] = field(default_factory=dict)
    patterns: list[PatternRule] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # "tools.x", "defaults.write" -> line
    limits: dict[str, float] = field(default_factory=dict)  # the `limits:` the file sets
    warnings: list[str] = field(default_factory=list)  # worth fixing, not worth refusing to start
    # Entries ("tools.X") that set high_risk themselves: they overrule a tool's own
    # high-risk declaration (an MCP server's destructiveHint); defaults do not.
    high_risk_entries: set[str] = field(default_factory=set)
    profiles: dict[str, Profile] = field(default_factory=dict)  # see tools/profiles.py


def read_policy(text: str, source: str, registry: ToolRegistry) -> PolicyContent:
    """Parse and check a policy document; raise PolicyError listing every problem."""
    root = compose(text, source, PolicyError)
    reader = _Reader(source, registry)
    content = reader.document(root)
    if not reader.errors:
        reader.check_patterns(content)
    reader.raise_errors(PolicyError)
    content.warnings = [message for _, message in sorted(reader.warnings)]
    return content


class _Reader(NodeReader):
    def __init__(self, source: str, registry: ToolRegistry) -> None:
        super().__init__(source)
        self.registry = registry
        self.warnings: list[tuple[int, str]] = []
        self.lines: dict[str, int] = {}
        self.known_roles: set[str] = {EVERYONE, EXTERNAL}
        self.high_risk_entries: set[str] = set()

    # -- sections -----------------------------------------------------------

    def document(self, root: Node | None) -> PolicyContent:
        content = PolicyContent()
        if root is None or _is_null(root):
            return content
        sections: dict[str, tuple[Node, Node]] = {}
        with suppress(_Invalid):
            sections = self.mapping(root, "the policy", TOP_LEVEL_KEYS)
        if "roles" in sections:
            with suppress(_Invalid):
                content.roles = self.roles(sections["roles"][1])
        self.known_roles |= set(content.roles)
        if "admins" in sections:
            with suppress(_Invalid):
                content.admins = tuple(self.roles_named(sections["admins"][1], "admins"))
        if "approvals_channel" in sections:
            with suppress(_Invalid):
                content.approvals_channel = self.channel(sections["approvals_channel"][1])
        if "limits" in sections:
            content.limits = self.limits(sections["limits"][1])
        if "defaults" in sections:
            with suppress(_Invalid):
                content.default_grants = self.defaults(sections["defaults"][1], content.defaults)
        if "tools" in sections:
            with suppress(_Invalid):
                content.tools, content.patterns = self.tools(sections["tools"][1], content.defaults)
        if "profiles" in sections:
            with suppress(_Invalid):
                content.profiles = read_profiles(self, sections["profiles"][1])
        content.lines = self.lines
        content.high_risk_entries = self.high_risk_entries
        return content

    def roles(self, node: Node) -> dict[str, frozenset[str]]:
        roles: dict[str, frozenset[str]] = {}
        for name, (key, value) in self.mapping(node, "roles").items():
            if name in (EVERYONE, EXTERNAL, REQUESTER):
                self.error(key, f"'{name}' is a built-in role; remove it from roles")
            elif not _ROLE_NAME.match(name):
                self.error(key, f"role name {name!r} is invalid: use letters, digits, _ - .")
            else:
                roles[name] = frozenset()
                with suppress(_Invalid):
                    roles[name] = frozenset(self.members(value, name))
        return roles

    def members(self, node: Node, role: str) -> list[str]:
        members = []
        for member, item in self.strings(node, f"roles.{role}", "[U0123ABCD, '@support-team']"):
            if _USER_ID.match(member):
                members.append(member)
            elif _GROUP_HANDLE.match(member.lower()):
                members.append(member.lower())
            else:
                self.error(
                    item,
                    f"roles.{role}: {member!r} must be a Slack user id (U… or W…) "
                    "or a quoted user group handle like '@support-team'",
                )
        return members

    def channel(self, node: Node) -> str | None:
        if _is_null(node):
            return None
        value = self.scalar(node)
        if not isinstance(value, str) or not _CHANNEL_ID.match(value):
            raise self.invalid(
                node, "approvals_channel must be a Slack channel id like C0123ABCD, not a #name"
            )
        return value

    def limits(self, node: Node) -> dict[str, float]:
        """`limits:`: numbers from 0 (no limit) to a sane bound, per person."""
        limits: dict[str, float] = {}
        with suppress(_Invalid):
            for name, (_, value) in self.mapping(node, "limits", tuple(LIMIT_BOUNDS)).items():
                kind, bound = LIMIT_BOUNDS[name]
                number = self.scalar(value) if isinstance(value, yaml.ScalarNode) else None
                if _in_range(number, bound, whole=kind is int):
                    limits[name] = kind(number)
                else:
                    what = "a whole number" if kind is int else "a number"
                    self.error(
                        value, f"limits.{name} must be {what} from 0 (no limit) to {bound:g}"
                    )
        return limits

    def defaults(self, node: Node, defaults: dict[str, RuleFields]) -> frozenset[str]:
        """Merge `defaults:` into `defaults`; return the effects it grants (those it lists)."""
        entries = self.mapping(node, "defaults", EFFECTS)
        for effect, (key, value) in entries.items():
            self.lines[f"defaults.{effect}"] = key.start_mark.line + 1
            with suppress(_Invalid):
                overrides = self.rule(value, f"defaults.{effect}", DEFAULT_KEYS[effect], None)
                defaults[effect] = self.merged(
                    defaults[effect], overrides, key, f"defaults.{effect}"
                )
        return frozenset(entries)

    def tools(
        self, node: Node, defaults: dict[str, RuleFields]
    ) -> tuple[dict[str, RuleFields], list[PatternRule]]:
        rules: dict[str, RuleFields] = {}
        patterns: list[PatternRule] = []
        for name, (key, value) in self.mapping(node, "tools").items():
            self.lines[f"tools.{name}"] = key.start_mark.line + 1
            if is_pattern(name):
                with suppress(_Invalid):
                    patterns.append(self.pattern(name, key, value, defaults))
                continue
            tool = self.registry.get(name)
            if tool is None:
                hint = _suggest(name, self.registry.names())
                self.error(key, f"unknown tool {name!r}{hint}; check the name or load its module")
                continue
            with suppress(_Invalid):
                where = f"tools.{name}"
                overrides = self.rule(value, where, TOOL_KEYS[tool.effect], tool.parameters)
                rules[name] = self.merged(defaults[tool.effect], overrides, key, where)
                if "high_risk" in overrides:
                    self.high_risk_entries.add(where)
                elif tool.high_risk and "grants" in overrides:
                    self.error(
                        key,
                        f"{where}: grants are not allowed: {name} is declared high risk "
                        f"({tool.source} says it is destructive); remove grants, or set "
                        "high_risk: false if you have judged it safe to allow",
                    )
        return rules, patterns

    def pattern(
        self, pattern: str, key: Node, value: Node, defaults: dict[str, RuleFields]
    ) -> PatternRule:
        where = f"tools.{pattern}"
        if not _PATTERN.match(pattern):
            raise self.invalid(
                key,
                f"{where}: {pattern!r} is neither a tool name nor a pattern: tool names use "
                "letters, digits, _ and -; patterns add *, ? and [...], e.g. 'git_*'",
            )
        overrides = self.rule(value, where, PATTERN_KEYS, None)
        if "high_risk" in overrides:
            self.high_risk_entries.add(where)
        reads = {k: v for k, v in overrides.items() if k in TOOL_KEYS["read"]}
        rules = {
            "read": self.merged(defaults["read"], reads, key, where),
            "write": self.merged(defaults["write"], overrides, key, where),
        }
        return PatternRule(pattern, key.start_mark.line + 1, rules)

    def check_patterns(self, content: PolicyContent) -> None:
        """The most specific entry wins (see `specificity`): two equally specific patterns
        that both match a tool without its own entry are an error, since neither can win.
        A pattern that governs no tool grants nothing: a warning."""
        patterns = [entry.pattern for entry in content.patterns]
        line = {entry.pattern: entry.line for entry in content.patterns}
        governs: dict[str, list[str]] = {p: [] for p in patterns}
        clashes: dict[tuple[str, str], list[str]] = {}
        for name in self.registry.names():
            if name in content.tools:
                continue
            winner = most_specific(patterns, name)
            if winner is None:
                continue
            governs[winner].append(name)
            for other in patterns:
                if (
                    other != winner
                    and specificity(other) == specificity(winner)
                    and pattern_matches(other, name)
                ):
                    pair = tuple(sorted((winner, other), key=lambda p: line[p]))
                    clashes.setdefault((pair[0], pair[1]), []).append(name)
        for (first, second), names in clashes.items():
            self.errors.append(
                (
                    line[second],
                    f"{self.source} lines {line[first]} and {line[second]}: tools.{first} and "
                    f"tools.{second} both match {_names(names)} and are equally specific, so "
                    "neither can apply; make one more specific (a longer literal prefix), or "
                    f"give {names[0]} an entry of its own",
                )
            )
        for entry in content.patterns:
            if governs[entry.pattern]:
                continue
            where = f"tools.{entry.pattern}"
            matched = [n for n in self.registry.names() if pattern_matches(entry.pattern, n)]
            if not matched:
                self.warn(
                    entry.line,
                    f"{where}: the pattern matches no registered tool, so it grants nothing; "
                    "check it, or load the tools it is meant for",
                )
                continue
            instead = [
                f"tools.{n if n in content.tools else most_specific(patterns, n)}" for n in matched
            ]
            self.warn(
                entry.line,
                f"{where}: grants nothing: every tool it matches ({_names(matched)}) has a more "
                f"specific entry ({_names(list(dict.fromkeys(instead)))}), which applies "
                "instead (the most specific entry applies)",
            )

    # -- one rule -------------------------------------------------------------

    def rule(
        self, node: Node, where: str, keys: tuple[str, ...], parameters: dict[str, Any] | None
    ) -> dict[str, Any]:
        rule: dict[str, Any] = {}
        for key, (key_node, value) in self.mapping(node, where, keys).items():
            with suppress(_Invalid):
                if key == "allow":
                    rule[key] = tuple(self.roles_named(value, f"{where}.allow"))
                elif key == "approvers":
                    rule[key] = tuple(self.roles_named(value, f"{where}.approvers", requester=True))
                    if _is_empty(value):
                        raise self.invalid(
                            key_node, f"{where}.approvers is empty: name a role or 'requester'"
                        )
                elif key == "grants":
                    rule[key] = self.grant_scopes(value, f"{where}.grants")
                elif key in ("self_approval", "high_risk", "self_grants"):
                    rule[key] = self.boolean(value, f"{where}.{key}")
                elif key in ("remind_after", "escalate_after"):
                    rule[key] = self.duration(value, f"{where}.{key}")
                elif key == "remind_every":
                    rule[key] = self.duration(value, f"{where}.{key}")
                    if rule[key] < MIN_REMIND_EVERY:
                        raise self.invalid(
                            value, f"{where}.remind_every must be at least 1m (e.g. 4h)"
                        )
                elif key == "remind_limit":
                    number = self.scalar(value) if isinstance(value, yaml.ScalarNode) else None
                    if not _in_range(number, MAX_REMINDERS, whole=True) or not number:
                        raise self.invalid(
                            value,
                            f"{where}.remind_limit must be a whole number from 1 to "
                            f"{MAX_REMINDERS}: the reminders one card gets in all",
                        )
                    rule[key] = int(number)
                elif key == "escalate_to":
                    rule[key] = tuple(self.roles_named(value, f"{where}.escalate_to"))
                elif key == "constraints" and parameters is not None:
                    rule[key] = self.constraints(value, where, parameters)
        return rule

    def merged(
        self, base: RuleFields, overrides: dict[str, Any], node: Node, where: str
    ) -> RuleFields:
        rule = RuleFields(
            allow=overrides.get("allow", base["allow"]),
            approvers=overrides.get("approvers", base["approvers"]),
            self_approval=overrides.get("self_approval", base["self_approval"]),
            high_risk=overrides.get("high_risk", base["high_risk"]),
            constraints=overrides.get("constraints", base["constraints"]),
            remind_after=overrides.get("remind_after", base.get("remind_after")),
            escalate_to=overrides.get("escalate_to", base.get("escalate_to", ())),
            escalate_after=overrides.get("escalate_after", base.get("escalate_after")),
            remind_every=overrides.get("remind_every", base.get("remind_every")),
            remind_limit=overrides.get("remind_limit", base.get("remind_limit", 3)),
            grants=overrides.get("grants", base.get("grants", ())),
            self_grants=overrides.get("self_grants", base.get("self_grants", False)),
        )
        self.check_grants(rule, overrides, node, where)
        if rule.get("remind_every") is not None and rule.get("remind_after") is None:
            raise self.invalid(
                node,
                f"{where}: remind_every repeats the reminder remind_after sends; set "
                "remind_after too (e.g. remind_after: 30m and remind_every: 4h)",
            )
        if bool(rule["escalate_to"]) != (rule["escalate_after"] is not None):
            raise self.invalid(
                node,
                f"{where}: escalate_to and escalate_after go together: name the roles to "
                "escalate to and how long to wait first, e.g. escalate_to: [managers] and "
                "escalate_after: 4h",
            )
        if REQUESTER in rule["approvers"] and not rule["self_approval"]:
            inherited = "" if "approvers" in overrides else " (approvers come from the defaults)"
            raise self.invalid(
                node,
                f"{where}: approvers includes 'requester'{inherited} but self_approval is false, "
                "so the requester could never approve; remove 'requester' or set "
                "self_approval: true",
            )
        return rule

    def check_grants(
        self, rule: RuleFields, overrides: dict[str, Any], node: Node, where: str
    ) -> None:
        """Standing grants never for high-risk tools: refused where the entry asks for both;
        grants an entry inherits (from `defaults:`) do not apply to a high-risk one."""
        if rule.get("grants") and rule["high_risk"]:
            if "grants" in overrides:
                raise self.invalid(
                    node,
                    f"{where}: grants are not allowed for a high_risk tool (each of its calls "
                    "must be confirmed on its own); remove grants or set high_risk: false",
                )
            rule["grants"] = ()
        if rule.get("self_grants") and not (rule.get("grants") and rule["self_approval"]):
            raise self.invalid(
                node,
                f"{where}: self_grants lets the requester allow their own calls, so it needs "
                "grants (e.g. grants: [thread]) and self_approval: true",
            )

    def grant_scopes(self, node: Node, where: str) -> tuple[str, ...]:
        scopes: list[str] = []
        for scope, item in self.strings(node, where, "[thread, hour]"):
            if scope not in GRANT_SCOPES:
                self.error(
                    item,
                    f"{where}: unknown grant {scope!r}{_suggest(scope, GRANT_SCOPES)} "
                    f"(allowed: {', '.join(GRANT_SCOPES)})",
                )
            elif scope not in scopes:
                scopes.append(scope)
        return tuple(scopes)

    def constraints(
        self, node: Node, where: str, parameters: dict[str, Any]
    ) -> dict[str, tuple[Any, ...]]:
        properties: dict[str, Any] = parameters.get("properties", {})
        result: dict[str, tuple[Any, ...]] = {}
        for arg, (key, value) in self.mapping(node, f"{where}.constraints").items():
            if arg not in properties:
                known = ", ".join(properties) or "none"
                self.error(
                    key, f"{where}.constraints: unknown argument {arg!r} (its arguments: {known})"
                )
                continue
            with suppress(_Invalid):
                allowed = self.allowed_values(value, f"{where}.constraints.{arg}")
                check = Draft202012Validator({**parameters, **properties[arg]})
                for item, item_node in allowed:
                    if not check.is_valid(item):
                        self.error(
                            item_node, f"{where}.constraints.{arg}: {item!r} is not a valid value"
                        )
                result[arg] = tuple(item for item, _ in allowed)
        return result

    def allowed_values(self, node: Node, where: str) -> list[tuple[Any, Node]]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.invalid(
                node, f"{where} must be a non-empty list of allowed values, e.g. [IT, HR]"
            )
        values: list[tuple[Any, Node]] = []
        for item in node.value:
            if isinstance(item, yaml.ScalarNode):
                values.append((self.scalar(item), item))
            else:
                self.error(
                    item, f"{where}: allowed values must be plain values, not lists or mappings"
                )
        return values

    # -- typed values ---------------------------------------------------------

    def roles_named(self, node: Node, where: str, *, requester: bool = False) -> list[str]:
        roles = []
        for role, item in self.strings(node, where, "[support]"):
            if role == REQUESTER and not requester:
                self.error(item, f"{where}: 'requester' is only valid in approvers")
            elif role in self.known_roles or role == REQUESTER:
                roles.append(role)
            else:
                choices = [*self.known_roles, *([REQUESTER] if requester else [])]
                defined = ", ".join(sorted(self.known_roles - {EVERYONE, EXTERNAL})) or "none"
                self.error(
                    item,
                    f"{where}: unknown role {role!r}{_suggest(role, choices)}; define it under "
                    f"roles (defined: {defined}; built in: everyone"
                    f"{', requester' if requester else ''})",
                )
        return roles

    def mapping(
        self, node: Node, where: str, keys: tuple[str, ...] | None = None
    ) -> dict[str, tuple[Node, Node]]:
        return {} if _is_null(node) else super().mapping(node, where, keys)

    def unknown_key(self, where: str, key: str, keys: tuple[str, ...]) -> str:
        if key in WRITE_ONLY_KEYS:
            return f"{where}: {key!r} only applies to write tools; remove it"
        if key == "constraints":
            return (
                f"{where}: constraints need one tool's arguments; "
                "give them under the tool's own name in tools:"
            )
        return f"{where}: unknown key {key!r}{_suggest(key, keys)} (allowed: {', '.join(keys)})"

    def warn(self, line: int, message: str) -> None:
        self.warnings.append((line, f"{self.source} line {line}: {message}"))


def _in_range(value: Any, bound: float, *, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if whole and not float(value).is_integer():
        return False
    return 0 <= value <= bound  # False for NaN


def _is_empty(node: Node) -> bool:
    return _is_null(node) or (isinstance(node, yaml.SequenceNode) and not node.value)


def _names(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
