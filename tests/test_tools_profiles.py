"""Profiles in the policy file: read with the same line-numbered errors as the rest of the
policy; a profile narrows the tools a user may call and never widens them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import tools.builtin
from tools.exceptions import PolicyError
from tools.policy import Policy
from tools.profiles import MAX_INSTRUCTIONS_CHARS, Profile, read_instructions
from tools.registry import ToolRegistry


@pytest.fixture
def registry() -> ToolRegistry:
    fresh = ToolRegistry()
    tools.builtin.load(fresh)
    return fresh


def load(tmp_path: Path, registry: ToolRegistry, text: str) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return Policy.load(path, registry)


def problems(tmp_path: Path, registry: ToolRegistry, text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load(tmp_path, registry, text)
    return str(caught.value).splitlines()


EXAMPLE = """
roles:
  admins: [U0ADMIN]
tools:
  create_ticket: {allow: [admins]}
defaults:
  read: {allow: [everyone]}
profiles:
  it-help:
    channels: [C0ITHELP, G0PRIVATE]
    instructions: |
      You are Acme's IT help desk. Prefer existing tickets over new ones.
    tools: [create_ticket, search_tickets, "know*"]
    model: gpt-4.1
    demos: it-demos.yaml
  dm:
    instructions_file: dm.md
"""


@pytest.fixture
def example(tmp_path: Path, registry: ToolRegistry) -> Policy:
    (tmp_path / "it-demos.yaml").write_text("demonstrations: []\n")
    (tmp_path / "dm.md").write_text("  Keep answers short in DMs.\n")
    return load(tmp_path, registry, EXAMPLE)


def test_the_example_profiles_load_with_paths_next_to_the_policy_file(example, tmp_path):
    it = example.profiles["it-help"]
    assert it.channels == ("C0ITHELP", "G0PRIVATE")
    assert it.instructions == "You are Acme's IT help desk. Prefer existing tickets over new ones."
    assert it.tools == ("create_ticket", "search_tickets", "know*")
    assert it.model == "gpt-4.1"
    assert it.demos == tmp_path / "it-demos.yaml"
    assert it.line == 8
    assert example.profiles["dm"].instructions == "Keep answers short in DMs."
    assert example.profiles["dm"].model is None and example.profiles["dm"].tools is None


def test_a_channel_gets_its_profile_a_dm_the_dm_profile_anything_else_none(example):
    assert example.profile_for("C0ITHELP").name == "it-help"
    assert example.profile_for("G0PRIVATE").name == "it-help"
    assert example.profile_for("D0123ABC").name == "dm"
    assert example.profile_for("C0OTHER") is None
    assert example.profile_for("") is None


def test_a_profile_narrows_what_the_user_may_call_and_never_widens_it(example):
    everyone = example.allowed_tools({"everyone"})
    admin = example.allowed_tools(example.roles_for("U0ADMIN"))
    it = example.profiles["it-help"]
    # create_ticket is listed by the profile but limited to admins by the policy
    assert it.narrow(everyone) == ["knowledge_lookup", "search_tickets"]
    assert it.narrow(admin) == ["knowledge_lookup", "search_tickets", "create_ticket"]
    assert example.profiles["dm"].narrow(everyone) == everyone  # no tools: key, no narrowing


def test_profiles_change_the_policy_version_and_a_file_without_them_keeps_its_own(
    tmp_path, registry
):
    plain = "defaults:\n  read: {allow: [everyone]}\n"
    with_profile = plain + "profiles:\n  x:\n    channels: [C0X]\n    tools: [calculate]\n"
    other = plain + "profiles:\n  x:\n    channels: [C0X]\n    tools: [search_tickets]\n"
    versions = {Policy.parse(t, registry).version for t in (plain, with_profile, other)}
    assert len(versions) == 3
    assert "profiles" not in Policy.parse(plain, registry).to_json()


def test_every_profile_problem_is_one_line_naming_file_and_line(tmp_path, registry):
    text = """
    profiles:
      it-help:
        channels: [C0ITHELP, "#general"]
        tools: [create_tiket, search_tickets]
        demos: missing.yaml
        colour: blue
      finance:
        channels: [C0ITHELP]
        instructions: ""
        model: "gpt 4"
      "bad name!": {}
      both:
        channels: [C0BOTH]
        instructions: hello
        instructions_file: missing.md
    """
    lines = problems(tmp_path, registry, text)
    source = str(tmp_path / "policy.yaml")
    assert all(line.startswith(f"{source} line ") for line in lines), lines
    found = "\n".join(lines)
    assert (
        f"{source} line 3: profiles.it-help.channels: '#general' must be a Slack channel" in found
    )
    assert "line 4: profiles.it-help.tools: unknown tool 'create_tiket' (did you mean " in found
    assert f"line 5: profiles.it-help.demos: no such file: {tmp_path / 'missing.yaml'}" in found
    assert "line 6: profiles.it-help: unknown key 'colour'" in found
    assert "line 8: profiles.finance: channel C0ITHELP is already named on line 3" in found
    assert "line 9: profiles.finance.instructions must be a non-empty string" in found
    assert "line 10: profiles.finance.model: 'gpt 4' is not a model name" in found
    assert "line 11: profile name 'bad name!' is invalid" in found
    assert "line 15: profiles.both.instructions_file: no such file" in found
    assert "line 15: profiles.both: give instructions or instructions_file, not both" in found
    assert len(lines) == 10


def test_a_channel_named_twice_in_one_profile_is_an_error(tmp_path, registry):
    [line] = problems(tmp_path, registry, "profiles:\n  a:\n    channels: [C0A, C0A]\n")
    assert line.endswith(
        "line 3: profiles.a: channel C0A is already named on line 3; a channel "
        "belongs to one profile"
    )


def test_profile_and_policy_problems_are_reported_together_in_line_order(tmp_path, registry):
    text = "tools:\n  nope: {}\nprofiles:\n  a:\n    channels: [C0A]\n    tools: [nope]\n"
    lines = problems(tmp_path, registry, text)
    assert [line.split(":")[0].rsplit(" ", 1)[1] for line in lines] == ["2", "6"]


def test_a_pattern_that_matches_no_tool_and_a_profile_without_channels_are_warnings(
    tmp_path, registry
):
    policy = load(tmp_path, registry, 'profiles:\n  a:\n    tools: ["jira_*"]\n')
    assert any(
        "line 3: profiles.a.tools: the pattern 'jira_*' matches no" in w for w in policy.warnings
    )
    assert any("line 2: profiles.a: names no channels" in w for w in policy.warnings)
    assert policy.profiles["a"].narrow(["calculate"]) == []  # matches nothing: offers nothing


def test_instructions_are_bounded(tmp_path, registry):
    long_text = "x" * (MAX_INSTRUCTIONS_CHARS + 1)
    [line] = problems(
        tmp_path, registry, yaml.safe_dump({"profiles": {"dm": {"instructions": long_text}}})
    )
    assert f"is {MAX_INSTRUCTIONS_CHARS + 1} characters long; the limit is" in line
    big = tmp_path / "big.md"
    big.write_bytes(b"y" * (10 * MAX_INSTRUCTIONS_CHARS))
    [line] = problems(tmp_path, registry, "profiles:\n  dm:\n    instructions_file: big.md\n")
    assert "line 3: profiles.dm.instructions_file:" in line and "longer than" in line
    (tmp_path / "bin.md").write_bytes(b"\xff\xfe\x00")
    [line] = problems(tmp_path, registry, "profiles:\n  dm:\n    instructions_file: bin.md\n")
    assert "cannot read" in line


def test_reading_the_instructions_file_reads_no_more_than_the_limit_allows(tmp_path):
    path = tmp_path / "i.md"
    path.write_text("é" * 10, encoding="utf-8")  # 20 bytes, 10 characters
    assert read_instructions(path, limit=10) == "é" * 10
    path.write_text("é" * 11, encoding="utf-8")
    with pytest.raises(ValueError, match="longer than 10 characters"):
        read_instructions(path, limit=10)


names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_*?[]!"), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(
    profile=st.dictionaries(
        st.sampled_from(["channels", "instructions", "tools", "model", "demos", "x"]),
        st.one_of(
            st.text(max_size=30),
            st.lists(st.one_of(st.text(max_size=12), names), max_size=4),
            st.integers(),
            st.none(),
        ),
        max_size=5,
    ),
    name=st.text(max_size=12),
)
def test_any_profile_loads_or_fails_with_policy_errors_naming_lines(
    profile: dict, name: str
) -> None:
    registry = ToolRegistry()
    tools.builtin.load(registry)
    text = yaml.safe_dump({"profiles": {name: profile}})
    try:
        policy = Policy.parse(text, registry)
    except PolicyError as error:
        assert all(line.startswith("policy.yaml line ") for line in str(error).splitlines())
        return
    everyone = policy.allowed_tools({"everyone"})
    for loaded in policy.profiles.values():
        assert set(loaded.narrow(everyone)) <= set(everyone)


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(names, max_size=5),
    allowed=st.lists(st.sampled_from(["calculate", "git_log", "create_ticket", "x"]), unique=True),
)
def test_narrowing_keeps_order_and_only_allowed_tools(entries: list[str], allowed: list[str]):
    narrowed = Profile(name="p", tools=tuple(entries)).narrow(allowed)
    assert narrowed == [name for name in allowed if name in narrowed]


@settings(max_examples=200, deadline=None)
@given(operator=st.text(max_size=200), user=st.from_regex(r"U[A-Z0-9]{1,10}", fullmatch=True))
def test_the_built_in_rules_always_come_first_and_operator_text_is_kept_as_written(
    operator: str, user: str
) -> None:
    from worker.prompt import INSTRUCTIONS, build_messages
    from worker.run import Requester, Run

    run = Run(id="r1", question="q", requester=Requester(user_id=user), instructions=operator)
    [system] = build_messages(run)
    assert system["content"].startswith(INSTRUCTIONS.format(user_id=user))
    assert operator in system["content"]  # braces and all: never used as a template
