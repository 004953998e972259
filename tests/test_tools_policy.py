"""The permission policy: loading with line-numbered errors, roles, authorize, approvals."""

import textwrap
from pathlib import Path

import pytest

import tools.builtin
from tests.support.access import lets_decide
from tools.exceptions import PolicyError
from tools.policy import Denial, Policy, ToolRule
from tools.registry import ToolRegistry
from worker.service import Access


@pytest.fixture
def registry() -> ToolRegistry:
    fresh = ToolRegistry()
    tools.builtin.load(fresh)
    return fresh


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


EXAMPLE = """
roles:
  admins: [U0ADMIN]
  support: ["@support-team", U0SUPPORT]
admins: [admins]
approvals_channel: C0APPROVALS
tools:
  create_ticket:
    allow: [everyone]
    approvers: [requester]
    self_approval: true
    high_risk: false
    constraints: {project: [IT, HR]}
  close_ticket:
    allow: [support, admins]
    approvers: [support]
    high_risk: true
  search_tickets:
    allow: [everyone]
    constraints:
      status: [open, any]
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone], approvers: [requester], self_approval: true}
"""


@pytest.fixture
def policy(tmp_path: Path, registry: ToolRegistry) -> Policy:
    return Policy.load(write(tmp_path, EXAMPLE), registry)


def test_the_example_policy_loads(policy: Policy) -> None:
    assert policy.approvals_channel == "C0APPROVALS"
    assert policy.admins == ("admins",)
    assert policy.rule("close_ticket") == ToolRule(
        allow=("support", "admins"),
        approvers=("support",),
        self_approval=True,
        high_risk=True,
        constraints={},
    )
    assert dict(policy.rule("create_ticket").constraints) == {"project": ("IT", "HR")}
    assert policy.rule("update_ticket").approvers == ("requester",)
    assert policy.rule("calculate").allow == ("everyone",)
    with pytest.raises(KeyError):
        policy.rule("no_such_tool")


def test_roles_for_users_and_groups(policy: Policy) -> None:
    assert policy.roles_for("U0ADMIN") == {"everyone", "admins"}
    assert policy.roles_for("U0SUPPORT") == {"everyone", "support"}
    assert policy.roles_for("U999", ["@support-team"]) == {"everyone", "support"}
    assert policy.roles_for("U999", ["Support-Team"]) == {"everyone", "support"}
    assert policy.roles_for("U999", ["@other"]) == {"everyone"}
    assert Access(policy).may_administer(policy.roles_for("U0ADMIN"))
    assert not Access(policy).may_administer(policy.roles_for("U999"))


def test_allowed_tools_follow_roles_in_registry_order(
    policy: Policy, registry: ToolRegistry
) -> None:
    everyone = policy.allowed_tools(policy.roles_for("U999"))
    assert "close_ticket" not in everyone
    assert everyone == [name for name in registry.names() if name != "close_ticket"]
    assert "close_ticket" in policy.allowed_tools({"support"})


def test_authorize_checks_roles_with_a_readable_reason(policy: Policy) -> None:
    args = {"ticket_id": 1, "resolution": "done"}
    assert policy.authorize("close_ticket", {"everyone"}, args) == Denial(
        "You may not call close_ticket: it is limited to support or admins."
    )
    assert policy.authorize("close_ticket", {"support"}, args) is None
    assert policy.authorize("close_ticket", set(), args) == Denial(
        "You may not call close_ticket: it is limited to support or admins."
    )
    assert policy.authorize("nope", {"admins"}, {}) == Denial(
        "You may not call nope: there is no such tool."
    )


def test_authorize_checks_constraints(policy: Policy) -> None:
    ok = {"project": "IT", "title": "VPN down", "body": "", "priority": "high"}
    assert policy.authorize("create_ticket", {"everyone"}, ok) is None
    assert policy.authorize("create_ticket", {"everyone"}, {**ok, "project": "FIN"}) == Denial(
        "project must be one of IT, HR"
    )
    missing = {"title": "VPN down"}
    assert policy.authorize("create_ticket", {"everyone"}, missing) == Denial(
        "project must be one of IT, HR"
    )
    assert policy.authorize("search_tickets", {"everyone"}, {"status": "closed"}) == Denial(
        "status must be one of open, any"
    )


def test_constraint_values_are_compared_exactly(tmp_path: Path, registry: ToolRegistry) -> None:
    policy = Policy.load(
        write(tmp_path, "tools:\n  close_ticket:\n    constraints: {ticket_id: [1, 2]}\n"),
        registry,
    )
    assert policy.authorize("close_ticket", set(), {"ticket_id": 2, "resolution": "x"}) is None
    for value in (True, "1", 1.5, 3):
        denial = policy.authorize("close_ticket", set(), {"ticket_id": value, "resolution": "x"})
        assert denial == Denial("ticket_id must be one of 1, 2")


def test_a_tool_allowed_to_nobody_is_disabled(tmp_path: Path, registry: ToolRegistry) -> None:
    policy = Policy.load(write(tmp_path, "tools:\n  calculate: {allow: []}\n"), registry)
    assert policy.authorize("calculate", {"everyone"}, {"expression": "1"}) == Denial(
        "You may not call calculate: it is disabled by policy."
    )
    assert "calculate" not in policy.allowed_tools({"everyone"})


# -- who may decide --------------------------------------------------------------

MATRIX_POLICY = """
roles:
  support: [U0SUP1, U0SUP2]
tools:
  create_ticket: {approvers: [requester], self_approval: true}
  update_ticket: {approvers: [support], self_approval: true}
  close_ticket: {approvers: [support], self_approval: false}
  search_tickets: {}
defaults:
  write: {approvers: [requester, support], self_approval: true}
"""


@pytest.mark.parametrize(
    ("tool", "requester", "decider", "expected"),
    [
        # requester-only approval: only the requester themselves
        ("create_ticket", "U0PLAIN", "U0PLAIN", True),
        ("create_ticket", "U0PLAIN", "U0SUP1", False),
        # role approval with self_approval true: requester must still not be listed
        ("update_ticket", "U0PLAIN", "U0SUP1", True),
        ("update_ticket", "U0SUP1", "U0SUP1", False),
        ("update_ticket", "U0SUP1", "U0SUP2", True),
        ("update_ticket", "U0PLAIN", "U0PLAIN", False),
        ("update_ticket", "U0PLAIN", "U0OTHER", False),
        # self_approval false: an approver-role holder may not approve their own call
        ("close_ticket", "U0SUP1", "U0SUP1", False),
        ("close_ticket", "U0SUP1", "U0SUP2", True),
        ("close_ticket", "U0PLAIN", "U0SUP2", True),
        ("close_ticket", "U0PLAIN", "U0PLAIN", False),
        # requester or role (the write default here)
        ("_default_write", "U0PLAIN", "U0PLAIN", True),
        ("_default_write", "U0PLAIN", "U0SUP1", True),
        ("_default_write", "U0SUP1", "U0SUP1", True),
        ("_default_write", "U0PLAIN", "U0OTHER", False),
        # read tools need no approval, so nobody decides
        ("search_tickets", "U0PLAIN", "U0PLAIN", False),
        ("search_tickets", "U0PLAIN", "U0SUP1", False),
        ("no_such_tool", "U0PLAIN", "U0PLAIN", False),
    ],
)
def test_may_decide_matrix(
    tmp_path: Path,
    registry: ToolRegistry,
    tool: str,
    requester: str,
    decider: str,
    expected: bool,
) -> None:
    from tools import register_tool

    register_tool(
        name="_default_write",
        description="A write tool with no rule of its own.",
        parameters={"type": "object", "properties": {}},
        handler=lambda ctx, args: None,
        registry=registry,
    )
    policy = Policy.load(write(tmp_path, MATRIX_POLICY), registry)
    roles = policy.roles_for(decider)
    assert lets_decide(policy, tool, requester, decider, roles) is expected


def test_everyone_as_approver_means_anyone_else(tmp_path: Path, registry: ToolRegistry) -> None:
    policy = Policy.load(
        write(tmp_path, "tools:\n  create_ticket: {approvers: [everyone]}\n"), registry
    )
    assert lets_decide(policy, "create_ticket", "U1", "U2", set())
    assert not lets_decide(policy, "create_ticket", "U1", "U1", {"everyone"})


def test_approvers_text(policy: Policy, tmp_path: Path, registry: ToolRegistry) -> None:
    assert policy.approvers_text("create_ticket") == "the requester"
    assert policy.approvers_text("close_ticket") == "@support"
    assert policy.approvers_text("calculate") == "nobody (it needs no approval)"
    both = Policy.load(
        write(
            tmp_path,
            "roles: {admins: [U1]}\ntools:\n  create_ticket: {approvers: [requester, admins]}\n",
        ),
        registry,
    )
    assert both.approvers_text("create_ticket") == "the requester or @admins"


# -- defaults and versions ------------------------------------------------------------


def test_default_policy(registry: ToolRegistry) -> None:
    policy = Policy.default(registry)
    assert policy.allowed_tools({"everyone"}) == registry.names()
    assert policy.rule("create_ticket") == ToolRule(
        allow=("everyone",), approvers=("requester",), self_approval=True, high_risk=False
    )
    assert lets_decide(policy, "create_ticket", "U1", "U1", {"everyone"})
    assert not lets_decide(policy, "create_ticket", "U1", "U2", {"everyone"})
    assert policy.approvals_channel is None
    assert not Access(policy).may_administer({"everyone"})
    assert policy.authorize("close_ticket", {"everyone"}, {"ticket_id": 1}) is None


def test_version_depends_on_content_not_formatting(tmp_path: Path, registry: ToolRegistry) -> None:
    a = Policy.parse("roles: {support: [U1]}\ntools: {close_ticket: {allow: [support]}}", registry)
    b = Policy.parse(
        "# comment\ntools:\n  close_ticket:\n    allow: [support]\nroles:\n  support: [U1]\n",
        registry,
    )
    c = Policy.parse("roles: {support: [U2]}\ntools: {close_ticket: {allow: [support]}}", registry)
    assert a.version == b.version != c.version
    assert len(a.version) == 12
    # no file is the same policy as a file that grants both effects by default, nothing else
    both = Policy.parse("defaults: {read: {}, write: {}}", registry)
    assert Policy.default(registry).version == both.version != Policy.parse("", registry).version


# -- errors name the file, the line and the fix -------------------------------------


def load_error(tmp_path: Path, registry: ToolRegistry, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        Policy.load(path, registry)
    message = str(caught.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tools:\n  close_tiket:\n    allow: [everyone]\n",
            "line 2: unknown tool 'close_tiket' (did you mean 'close_ticket'?)",
        ),
        (
            "roles:\n  support: [U1]\ntools:\n  close_ticket:\n    allow: [suport]\n",
            "line 5: tools.close_ticket.allow: unknown role 'suport' (did you mean 'support'?)",
        ),
        (
            "tools:\n  close_ticket:\n    allow: [requester]\n",
            "line 3: tools.close_ticket.allow: 'requester' is only valid in approvers",
        ),
        (
            "admins: [requester]\n",
            "line 1: admins: 'requester' is only valid in approvers",
        ),
        (
            "roles: {admins: [U1]}\nadmins: [admin]\n",
            "line 2: admins: unknown role 'admin' (did you mean 'admins'?)",
        ),
        (
            "tools:\n  close_ticket:\n    approver: [requester]\n",
            "line 3: tools.close_ticket: unknown key 'approver' (did you mean 'approvers'?)",
        ),
        ("rolez: {}\n", "line 1: the policy: unknown key 'rolez' (did you mean 'roles'?)"),
        (
            "tools:\n  close_ticket:\n    self_approval: yes please\n",
            "line 3: tools.close_ticket.self_approval must be true or false",
        ),
        (
            "tools:\n  close_ticket:\n    allow: support\n",
            "line 3: tools.close_ticket.allow must be a list, e.g. [support]",
        ),
        ("tools: [close_ticket]\n", "line 1: tools must be a mapping"),
        (
            "tools:\n  create_ticket:\n    constraints: {projects: [IT]}\n",
            "line 3: tools.create_ticket.constraints: unknown argument 'projects'",
        ),
        (
            "tools:\n  create_ticket:\n    constraints:\n      priority: [normal, critical]\n",
            "line 4: tools.create_ticket.constraints.priority: 'critical' is not a valid value",
        ),
        (
            "tools:\n  create_ticket:\n    constraints: {project: []}\n",
            "line 3: tools.create_ticket.constraints.project must be a non-empty list",
        ),
        (
            "tools:\n  search_tickets:\n    approvers: [requester]\n",
            "line 3: tools.search_tickets: 'approvers' only applies to write tools",
        ),
        (
            "tools:\n  create_ticket:\n    self_approval: false\n",
            "line 2: tools.create_ticket: approvers includes 'requester' (approvers come from "
            "the defaults) but self_approval is false",
        ),
        (
            "tools:\n  create_ticket:\n    approvers: []\n",
            "line 3: tools.create_ticket.approvers is empty",
        ),
        (
            "roles:\n  support: [bob]\n",
            "line 2: roles.support: 'bob' must be a Slack user id (U… or W…)",
        ),
        ("roles:\n  everyone: [U1]\n", "line 2: 'everyone' is a built-in role"),
        (
            "approvals_channel: '#approvals'\n",
            "line 1: approvals_channel must be a Slack channel id",
        ),
        (
            "defaults:\n  read: {approvers: [requester]}\n",
            "line 2: defaults.read: 'approvers' only applies to write tools",
        ),
        (
            "defaults:\n  write: {self_approval: false}\n",
            "line 2: defaults.write: approvers includes 'requester'",
        ),
        ("tools:\n  close_ticket: {}\n  close_ticket: {}\n", "line 3: tools: duplicate key"),
        ("tools:\n  close_ticket: {allow: [everyone\n", "line 3: invalid YAML"),
        ("- just\n- a list\n", "line 1: the policy must be a mapping"),
    ],
)
def test_load_errors_name_the_line_and_the_fix(
    tmp_path: Path, registry: ToolRegistry, text: str, expected: str
) -> None:
    assert expected in load_error(tmp_path, registry, text)


def test_every_problem_is_reported_at_once(tmp_path: Path, registry: ToolRegistry) -> None:
    message = load_error(
        tmp_path,
        registry,
        "tools:\n  nope: {}\n  close_ticket:\n    allow: [ghosts]\n    bogus: 1\n",
    )
    lines = message.splitlines()
    assert len(lines) == 3
    assert [line.split(": ", 1)[0][-6:] for line in lines] == ["line 2", "line 4", "line 5"]


def test_missing_file(tmp_path: Path, registry: ToolRegistry) -> None:
    with pytest.raises(PolicyError, match="policy file not found"):
        Policy.load(tmp_path / "absent.yaml", registry)


def test_an_empty_file_grants_nothing(tmp_path: Path, registry: ToolRegistry) -> None:
    policy = Policy.load(write(tmp_path, "# nothing yet\n"), registry)
    assert policy.allowed_tools({"everyone", "admins"}) == []
    assert policy.disabled_tools() == registry.names()


def test_external_people_hold_only_what_the_policy_names_for_them(registry: ToolRegistry) -> None:
    policy = Policy.parse(
        """
tools:
  calculate: {allow: [everyone, external]}
  knowledge_lookup: {allow: [everyone]}
""",
        registry,
    )
    assert "calculate" in policy.allowed_tools({"external"})
    assert "knowledge_lookup" not in policy.allowed_tools({"external"})  # not `everyone`
    assert policy.authorize("knowledge_lookup", {"external"}, {}) is not None
    assert "knowledge_lookup" in policy.allowed_tools(set())


def test_external_is_a_built_in_role(registry: ToolRegistry) -> None:
    with pytest.raises(PolicyError, match="built-in role"):
        Policy.parse("roles:\n  external: [U1]\n", registry)
