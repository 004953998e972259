"""Least privilege: with a policy file, a tool the file does not grant is neither offered nor
run. Grants come from a tool's own entry, a pattern under `tools:`, or `defaults:`."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import tools.builtin
from tests.support.access import lets_decide
from tools import register_tool
from tools.exceptions import PolicyError
from tools.patterns import is_pattern, most_specific, pattern_matches, specificity
from tools.policy import Denial, Policy
from tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parent.parent

# What an MCP git server brings: tools in bulk, with a common prefix.
GIT_TOOLS = {"git_log": "read", "git_status": "read", "git_commit": "write", "git_push": "write"}


@pytest.fixture
def registry() -> ToolRegistry:
    fresh = ToolRegistry()
    tools.builtin.load(fresh)
    for name, effect in GIT_TOOLS.items():
        register_tool(
            name=name,
            description=f"The git tool {name}.",
            parameters={"type": "object", "properties": {}},
            effect=effect,  # type: ignore[arg-type]
            handler=lambda ctx, args: None,
            registry=fresh,
        )
    return fresh


READ_ONLY = "tools:\n  knowledge_lookup: {allow: [everyone]}\n"


def test_without_a_file_every_tool_keeps_the_built_in_defaults(registry: ToolRegistry) -> None:
    policy = Policy.default(registry)
    assert policy.disabled_tools() == []
    assert policy.disabled_summary() is None
    assert policy.allowed_tools({"everyone"}) == registry.names()
    assert policy.rule_source("git_push") == "defaults.write"


def test_a_tool_the_file_does_not_name_is_neither_offered_nor_authorized(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(READ_ONLY, registry)
    assert policy.allowed_tools({"everyone", "admins"}) == ["knowledge_lookup"]
    assert policy.authorize("knowledge_lookup", set(), {"name": "SQL Basics"}) is None
    assert policy.authorize("create_ticket", {"everyone"}, {"title": "x"}) == Denial(
        "You may not call create_ticket: the policy file grants no rule for create_ticket; "
        "ask an admin to add it under `tools:`."
    )
    assert policy.authorize_caller("calculate", {"everyone"}) == Denial(
        "You may not call calculate: the policy file grants no rule for calculate; "
        "ask an admin to add it under `tools:`."
    )
    assert policy.rule_source("create_ticket") is None
    assert policy.rule("create_ticket").allow == ()
    # nobody may approve a call of it either, and cards say why
    assert not lets_decide(policy, "create_ticket", "U1", "U1", {"everyone"})
    assert not lets_decide(policy, "create_ticket", "U1", "U2", {"everyone"})
    assert policy.approvers_text("create_ticket") == "nobody (the policy grants it no rule)"


def test_disabled_tools_are_listed_in_registry_order_with_a_summary(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(READ_ONLY, registry, source="policy.yaml")
    disabled = policy.disabled_tools()
    assert disabled == [name for name in registry.names() if name != "knowledge_lookup"]
    summary = policy.disabled_summary()
    assert summary is not None and "\n" not in summary
    assert summary.startswith("9 of 10 tools are disabled because policy.yaml grants them no rule")
    assert "calculate, search_tickets, create_ticket, update_ticket, close_ticket and 4 more" in (
        summary
    )


def test_an_explicit_allow_nobody_is_not_a_missing_rule(registry: ToolRegistry) -> None:
    policy = Policy.parse("tools:\n  calculate: {allow: []}\n", registry)
    assert "calculate" not in policy.disabled_tools()  # it has a rule: the file disabled it
    assert policy.authorize_caller("calculate", set()) == Denial(
        "You may not call calculate: it is disabled by policy."
    )


def test_naming_a_tool_grants_it_with_the_built_in_fields(registry: ToolRegistry) -> None:
    policy = Policy.parse("tools:\n  create_ticket: {}\n", registry)
    assert policy.allowed_tools({"everyone"}) == ["create_ticket"]
    assert policy.rule("create_ticket") == Policy.default(registry).rule("create_ticket")


def test_defaults_grant_one_effect_to_every_tool_the_file_does_not_name(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(READ_ONLY + "defaults:\n  write: {allow: [everyone]}\n", registry)
    writes = [tool.name for tool in registry if tool.effect == "write"]
    assert policy.allowed_tools({"everyone"}) == ["knowledge_lookup", *writes]
    assert policy.rule_source("git_push") == "defaults.write"
    assert policy.lines["defaults.write"] == 4
    # the fields it leaves out are the built-in ones: the requester approves
    assert lets_decide(policy, "git_push", "U1", "U1", {"everyone"})
    assert policy.disabled_tools() == ["calculate", "search_tickets", "git_log", "git_status"]


def test_defaults_that_restrict_still_grant(registry: ToolRegistry) -> None:
    policy = Policy.parse(
        "roles: {support: [U0SUP]}\ndefaults:\n  write: {approvers: [support]}\n", registry
    )
    assert "git_push" not in policy.disabled_tools()
    assert lets_decide(policy, "git_push", "U1", "U0SUP", policy.roles_for("U0SUP"))
    assert policy.authorize("git_push", set(), {}) is None  # allow comes from the built-ins


def test_the_readme_defaults_block_restores_the_behaviour_without_a_file(
    registry: ToolRegistry,
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL)
    [block] = [b for b in blocks if b.startswith("defaults:")]
    policy = Policy.parse(block, registry, source="README.md")
    default = Policy.default(registry)
    assert policy.version == default.version
    assert policy.disabled_tools() == []
    for name in registry.names():
        assert policy.rule(name) == default.rule(name)


def test_the_example_policy_grants_every_built_in_tool() -> None:
    builtins = ToolRegistry()
    tools.builtin.load(builtins)
    policy = Policy.load(ROOT / "deploy" / "policy.example.yaml", builtins)
    assert policy.disabled_tools() == []
    assert policy.warnings == ()


# -- patterns ----------------------------------------------------------------------

PATTERNS = """\
roles:
  support: [U0SUP]
  admins: [U0ADMIN]
tools:
  git_push:
    allow: [admins]
    approvers: [admins]
  "git_*":
    allow: [support]
    approvers: [support]
    high_risk: true
  "*":
    allow: [admins]
"""


def test_a_pattern_grants_the_tools_it_matches(registry: ToolRegistry) -> None:
    policy = Policy.parse(PATTERNS, registry)
    assert policy.rule_source("git_log") == "tools.git_*"
    assert policy.lines["tools.git_*"] == 8
    assert "git_log" in policy.allowed_tools({"support"})
    assert policy.authorize("git_commit", policy.roles_for("U0SUP"), {}) is None
    assert policy.authorize("git_commit", {"everyone"}, {}) == Denial(
        "You may not call git_commit: it is limited to support."
    )
    # write-only fields apply to the writes it matches; reads need no approval
    assert policy.rule("git_commit").high_risk
    assert policy.rule("git_commit").approvers == ("support",)
    assert policy.rule("git_log").approvers == ()
    assert not policy.rule("git_log").high_risk


def test_an_exact_name_beats_a_pattern_and_a_more_specific_pattern_beats_a_broader_one(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(PATTERNS, registry)
    assert policy.rule_source("git_push") == "tools.git_push"
    assert policy.rule("git_push").allow == ("admins",)
    assert policy.rule_source("git_status") == "tools.git_*"
    assert policy.rule_source("calculate") == "tools.*"
    assert policy.disabled_tools() == []
    assert policy.allowed_tools({"everyone"}) == []
    # the file's order does not matter: the broad pattern first gives the same rules
    reordered = PATTERNS.replace('  "*":\n    allow: [admins]\n', "").replace(
        "tools:\n", 'tools:\n  "*":\n    allow: [admins]\n'
    )
    assert reordered != PATTERNS
    other = Policy.parse(reordered, registry)
    assert other.version == policy.version
    assert [other.rule_source(n) for n in registry.names()] == [
        policy.rule_source(n) for n in registry.names()
    ]


def test_patterns_are_part_of_the_version(registry: ToolRegistry) -> None:
    one = Policy.parse('tools:\n  "git_*": {allow: [everyone]}\n', registry)
    other = Policy.parse('tools:\n  "git_l*": {allow: [everyone]}\n', registry)
    assert one.version != other.version
    assert one.to_json()["patterns"][0]["pattern"] == "git_*"


def test_a_pattern_that_matches_nothing_is_a_warning_not_an_error(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(
        'tools:\n  knowledge_lookup: {}\n  "jira_*": {allow: [everyone]}\n',
        registry,
        source="policy.yaml",
    )
    assert policy.warnings == (
        "policy.yaml line 3: tools.jira_*: the pattern matches no registered tool, so it "
        "grants nothing; check it, or load the tools it is meant for",
    )
    assert policy.allowed_tools({"everyone"}) == ["knowledge_lookup"]


def test_the_most_specific_pattern_wins_wherever_it_is_in_the_file(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(
        'tools:\n  "git_*": {}\n  "git_log*": {allow: []}\n  "*_status": {allow: []}\n',
        registry,
        source="policy.yaml",
    )
    assert policy.rule_source("git_log") == "tools.git_log*"  # longer literal prefix
    assert policy.rule("git_log").allow == ()
    assert policy.rule_source("git_status") == "tools.git_*"  # "git_" beats no prefix at all
    assert policy.rule("git_status").allow == ("everyone",)
    assert policy.warnings == (
        "policy.yaml line 4: tools.*_status: grants nothing: every tool it matches "
        "(git_status) has a more specific entry (tools.git_*), which applies instead (the "
        "most specific entry applies)",
    )


@pytest.mark.parametrize(
    ("patterns", "name", "winner"),
    [
        (["git_*", "git_diff*"], "git_diff_staged", "git_diff*"),  # longer literal prefix
        (["git_*", "git_*_log"], "git_x_log", "git_*_log"),  # same prefix, more literals
        (["git_*?*", "git_*"], "git_log", "git_*"),  # same literals, fewer wildcards
        (["*_log", "git_*"], "git_log", "git_*"),  # a prefix beats a suffix
        (["[gh]it_*", "g*"], "git_log", "g*"),  # a class is a wildcard, not a literal
        (["*", "git_log"], "git_log", "git_log"),  # no wildcard at all: most specific
    ],
)
def test_specificity_is_literal_prefix_then_literals_then_fewer_wildcards(
    patterns: list[str], name: str, winner: str
) -> None:
    assert most_specific(patterns, name) == winner
    assert most_specific(list(reversed(patterns)), name) == winner


def test_equally_specific_patterns_that_match_one_tool_are_an_error_naming_both_lines(
    registry: ToolRegistry,
) -> None:
    text = 'tools:\n  "[gh]it_log": {}\n  "git_?og": {}\n  "git_[l]og": {}\n'
    assert specificity("git_?og") == specificity("git_[l]og") == (4, 6, -1)
    with pytest.raises(PolicyError) as caught:
        Policy.parse(text, registry, source="policy.yaml")
    assert str(caught.value) == (
        "policy.yaml lines 3 and 4: tools.git_?og and tools.git_[l]og both match git_log and "
        "are equally specific, so neither can apply; make one more specific (a longer "
        "literal prefix), or give git_log an entry of its own"
    )
    # the tool's own entry settles it, and patterns that never meet are not a problem
    Policy.parse(text + "  git_log: {}\n", registry)
    Policy.parse('tools:\n  "git_l*": {}\n  "git_s*": {}\n', registry)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'tools:\n  "git_*":\n    constraints: {x: [1]}\n',
            "line 3: tools.git_*: constraints need one tool's arguments; give them under the "
            "tool's own name",
        ),
        (
            'tools:\n  "git.*": {}\n',
            "line 2: tools.git.*: 'git.*' is neither a tool name nor a pattern",
        ),
        (
            'tools:\n  "git_*":\n    allow: [suport]\n',
            "line 3: tools.git_*.allow: unknown role 'suport'",
        ),
        (
            'tools:\n  "git_*":\n    self_approval: false\n',
            "line 2: tools.git_*: approvers includes 'requester' (approvers come from the "
            "defaults) but self_approval is false",
        ),
        (
            "defaults:\n  read: {constraints: {x: [1]}}\n",
            "line 2: defaults.read: constraints need one tool's arguments",
        ),
    ],
)
def test_pattern_errors_name_the_line_and_the_fix(
    registry: ToolRegistry, text: str, expected: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy.parse(text, registry, source="policy.yaml")
    assert expected in str(caught.value)


# -- the matcher, against whatever an operator types ---------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "_-"
names = st.text(NAME_CHARS, min_size=1, max_size=64)
pattern_text = st.text(NAME_CHARS + "*?[]!", min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(pattern=st.one_of(pattern_text, st.text(max_size=40)), name=st.one_of(names, st.text()))
def test_matching_any_text_never_raises(pattern: str, name: str) -> None:
    assert pattern_matches(pattern, name) in (True, False)


@settings(max_examples=300, deadline=None)
@given(key=names, name=names)
def test_a_key_without_glob_characters_matches_only_itself(key: str, name: str) -> None:
    assert not is_pattern(key)
    assert pattern_matches(key, key)
    assert pattern_matches(key, name) == (key == name)


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(NAME_CHARS, max_size=20), name=names)
def test_a_prefix_star_matches_exactly_the_names_with_that_prefix(prefix: str, name: str) -> None:
    assert pattern_matches(prefix + "*", name) == name.startswith(prefix)
    assert pattern_matches(prefix + "*", prefix + name)
    assert pattern_matches("*", name)


@settings(max_examples=300, deadline=None)
@given(name=names)
def test_question_marks_and_brackets_match_single_characters(name: str) -> None:
    assert pattern_matches("?" * len(name), name)
    assert not pattern_matches("?" * (len(name) + 1), name)
    escaped = "".join(f"[{c}]" for c in name)  # every character spelled as a one-letter class
    assert pattern_matches(escaped, name)
    assert pattern_matches(name.upper(), name) == (name.upper() == name)  # case-sensitive


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(pattern_text, st.text(max_size=30)))
def test_any_tools_key_loads_or_fails_with_a_policy_error(key: str) -> None:
    registry = ToolRegistry()
    tools.builtin.load(registry)
    text = yaml.safe_dump({"tools": {key: {"allow": ["everyone"]}}})
    try:
        policy = Policy.parse(text, registry)
    except PolicyError as error:
        assert "line" in str(error)
        return
    for name in registry.names():
        source = policy.rule_source(name)
        granted = name == key or (is_pattern(key) and pattern_matches(key, name))
        assert source == (f"tools.{key}" if granted else None)


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(pattern_text, min_size=1, max_size=6, unique=True), name=names)
def test_the_most_specific_match_wins_whatever_the_order_of_the_entries(
    patterns: list[str], name: str
) -> None:
    matching = [p for p in patterns if pattern_matches(p, name)]
    winner = most_specific(patterns, name)
    assert (winner is None) == (not matching)
    if winner is None:
        return
    assert all(specificity(p) <= specificity(winner) for p in matching)
    equals = [p for p in matching if specificity(p) == specificity(winner)]
    if len(equals) == 1:  # no tie (a tie is a start-up error): the order does not matter
        assert most_specific(list(reversed(patterns)), name) == winner
    for pattern in matching:  # the tool's own name is more specific than any pattern
        if is_pattern(pattern):
            assert specificity(pattern) < specificity(name)
