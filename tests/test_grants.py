"""Standing grants below Slack: the policy syntax (and what it refuses at load), the
argument constraint, reading the grant form, and the store's atomic use against its own
expiry and revocation (a real Redis)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

import tools.builtin
from approvals.grants import MAX_LIVE, Constraint, Grant, GrantStore, TooManyGrants
from approvals.store import new_request
from bot.render.grants import OPTIONS_PER_GROUP, WIDEN_BLOCK, WIDEN_INPUT, read_widened
from tests.support.access import Asked
from tools.exceptions import PolicyError
from tools.policy import Policy
from tools.registry import Tool, ToolRegistry
from worker.service import Access

BASE = """\
roles:
  support: [USUPPORT]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support]
    self_approval: false
"""


@pytest.fixture
def registry() -> ToolRegistry:
    fresh = ToolRegistry()
    tools.builtin.load(fresh)
    fresh.register(
        Tool(
            name="drop_table",
            description="Destructive, as an MCP server's destructiveHint says.",
            parameters={"type": "object", "properties": {"name": {"type": "string"}}},
            effect="write",
            handler=lambda ctx, args: None,
            high_risk=True,
            annotations={"destructiveHint": True},
        )
    )
    return fresh


def test_a_policy_without_grants_offers_none_and_keeps_its_version(registry: ToolRegistry) -> None:
    policy = Policy.parse(BASE, registry)
    assert policy.rule("create_ticket").grants == ()
    assert "grants" not in policy.to_json()["tools"]["create_ticket"]
    assert Access(policy).grant_scopes(Asked("create_ticket", "UALICE")) == ()
    with_grants = Policy.parse(BASE + "    grants: [thread, hour]\n", registry)
    assert with_grants.rule("create_ticket").grants == ("thread", "hour")
    assert with_grants.version != policy.version


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("    grants: [week]\n", "unknown grant 'week'"),
        ("    grants: [thread]\n    high_risk: true\n", "not allowed for a high_risk tool"),
        ("    grants: [thread]\n    self_grants: true\n", "self_grants lets the requester"),
        ("    grants: thread\n", "must be a list"),
    ],
)
def test_bad_grants_are_refused_at_load_with_the_line(
    registry: ToolRegistry, entry: str, says: str
) -> None:
    with pytest.raises(PolicyError, match=says) as caught:
        Policy.parse(BASE + entry, registry)
    assert "line" in str(caught.value)


def test_a_tool_declared_high_risk_never_offers_grants(registry: ToolRegistry) -> None:
    named = BASE + "  drop_table:\n    allow: [everyone]\n    approvers: [support]\n"
    with pytest.raises(PolicyError, match="declared high risk"):
        Policy.parse(named + "    grants: [hour]\n", registry)
    inherited = BASE + "defaults:\n  write: {allow: [everyone], grants: [thread]}\n"
    policy = Policy.parse(inherited, registry)
    assert policy.rule("drop_table").high_risk and policy.rule("drop_table").grants == ()
    assert Access(policy).grant_scopes(Asked("drop_table", "UALICE")) == ()


def test_only_an_approver_may_grant_and_a_requester_only_where_self_grants(
    registry: ToolRegistry,
) -> None:
    policy = Policy.parse(BASE + "    grants: [thread]\n", registry)
    access, asked = Access(policy), Asked("create_ticket", "UALICE")
    assert access.may_grant(asked, "thread", "USUPPORT", policy.roles_for("USUPPORT"))
    assert not access.may_grant(asked, "hour", "USUPPORT", policy.roles_for("USUPPORT"))
    assert not access.may_grant(asked, "thread", "UBOB", policy.roles_for("UBOB"))
    selfish = BASE.replace("[support]", "[requester, support]").replace("false", "true")
    roles = policy.roles_for("UALICE")
    assert not Access(Policy.parse(selfish + "    grants: [thread]\n", registry)).may_grant(
        asked, "thread", "UALICE", roles
    )
    allowed = Policy.parse(selfish + "    grants: [thread]\n    self_grants: true\n", registry)
    assert Access(allowed).may_grant(asked, "thread", "UALICE", roles)


def test_an_escalation_role_decides_the_escalated_request_but_grants_nothing(
    registry: ToolRegistry,
) -> None:
    """The calls a grant covers are not escalated: only who may approve those may grant."""
    text = BASE.replace("support: [USUPPORT]", "support: [USUPPORT]\n  managers: [UBOSS]")
    text += "    escalate_to: [managers]\n    escalate_after: 4h\n    grants: [thread]\n"
    policy = Policy.parse(text, registry)
    access, escalated = Access(policy), Asked("create_ticket", "UALICE", escalated=True)
    assert access.may_decide(escalated, "UBOSS", policy.roles_for("UBOSS"))
    assert not access.may_grant(escalated, "thread", "UBOSS", policy.roles_for("UBOSS"))
    assert access.may_grant(escalated, "thread", "USUPPORT", policy.roles_for("USUPPORT"))


# -- the constraint --------------------------------------------------------------------------

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=4,
)
ARGS = st.dictionaries(st.text(min_size=1, max_size=6), VALUES, min_size=1, max_size=5)


@given(args=ARGS, data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_grant_covers_its_own_call_and_only_what_the_approver_widened(
    args: dict[str, Any], data: st.DataObject
) -> None:
    names = sorted(args)
    widened = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    constraint = Constraint.of(args, widened)
    assert constraint.allows(args)
    name = data.draw(st.sampled_from(names))
    changed = {**args, name: ["changed", args[name]]}
    assert constraint.allows(changed) == (name in widened)
    assert constraint.allows({**args, "\x00new": 1}) is False  # an argument it never saw
    without = {k: v for k, v in args.items() if k != name}
    assert constraint.allows(without) == (name in widened)


# -- the form ---------------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=10,
)


@given(values=JSONISH, names=st.lists(st.text(max_size=5), max_size=25, unique=True))
@settings(max_examples=80, deadline=None)
def test_reading_the_grant_form_never_fails_and_names_only_offered_arguments(
    values: Any, names: list[str]
) -> None:
    widened = read_widened(values, names)
    assert widened is None or widened <= set(names)


def selected(*values: str, group: int = 0) -> dict[str, Any]:
    options = [{"value": v} for v in values]
    return {f"{WIDEN_BLOCK}{group}": {WIDEN_INPUT: {"selected_options": options}}}


def test_the_form_maps_options_to_arguments_and_refuses_forged_ones() -> None:
    names = [f"a{i}" for i in range(OPTIONS_PER_GROUP + 2)]
    assert read_widened(selected("0:1"), names) == {"a1"}
    assert read_widened(selected("1:1", group=1), names) == {"a11"}
    assert read_widened({}, names) == set()
    for forged in ("1:0", "0:12", "0:-1", "0:1 ", "x", "0:99999999"):
        assert read_widened(selected(forged), names) is None, forged
    assert read_widened(selected("1:5", group=1), names) is None  # past the last argument


# -- the store: atomic against expiry and revocation -----------------------------------------


def make_grant(store: GrantStore, **overrides: Any) -> Any:
    fields: dict[str, Any] = {
        "tool": "create_ticket",
        "requester": "UALICE",
        "team_id": "T1",
        "grantor": "USUPPORT",
        "grantor_team": "T1",
        "scope": "hour",
        "thread": "",
        "constraint": Constraint.of({"project": "IT"}, set()),
        "policy_version": "v1",
        "tool_digest": "d1",
        "approval_id": "ap_00000000",
        "run_id": "r00000000",
    }
    return store.create(**{**fields, **overrides})


def stored(store: GrantStore, grant_id: str) -> Grant:
    found = store.find(grant_id)
    assert found is not None
    return found


def request(n: int) -> Any:
    return new_request(
        approval_id=f"ap_{n:08x}",
        run_id="r00000001",
        call_id=f"call_{n}",
        tool="create_ticket",
        args={"project": "IT"},
        requester="UALICE",
        team_id="T1",
        channel_id="C1",
        policy_version="v1",
        ttl=60,
    )


def test_a_grant_covers_nothing_once_revoked_expired_or_made_under_another_version(
    redis_conn: redis.Redis,
) -> None:
    store = GrantStore(redis_conn)
    grant = make_grant(store)
    use = store.use(grant, request(1), policy_version="v1", tool_digest="d1", ttl=60)
    assert use.why == "ok" and use.request is not None
    assert (use.request.status.value, use.request.decided_by) == ("approved", "USUPPORT")
    assert use.request.grant_id == grant.id
    again = store.use(grant, request(1), policy_version="v1", tool_digest="d1", ttl=60)
    assert again.why == "exists" and stored(store, grant.id).uses == 1  # a retried step
    assert store.use(grant, request(2), policy_version="v2", tool_digest="d1", ttl=60).why == (
        "policy_changed"
    )
    assert store.use(grant, request(3), policy_version="v1", tool_digest="d2", ttl=60).why == (
        "tool_changed"
    )
    assert store.revoke(grant, "UALICE") and not store.revoke(grant, "UALICE")
    assert store.use(grant, request(4), policy_version="v1", tool_digest="d1", ttl=60).why == (
        "revoked"
    )
    assert store.live_for("UALICE") == []
    short = make_grant(store)  # its hour is up a moment before the call comes, by Redis's
    seconds, micros = redis_conn.time()  # clock (the one the script reads)
    redis_conn.hset(store.keys.grant(short.id), "expires_at", seconds + micros / 1e6 - 0.001)
    assert store.use(short, request(5), policy_version="v1", tool_digest="d1", ttl=60).why == (
        "expired"
    )


def test_a_grant_racing_its_revocation_covers_no_call_decided_after_it(
    redis_conn: redis.Redis,
) -> None:
    store = GrantStore(redis_conn)
    grant = make_grant(store)
    approved: list[Any] = []
    start = threading.Barrier(5)

    def use_many(offset: int) -> None:
        start.wait()
        for n in range(offset, offset + 100):
            done = store.use(grant, request(n), policy_version="v1", tool_digest="d1", ttl=60)
            if done.request is not None:
                approved.append(done.request)

    threads = [threading.Thread(target=use_many, args=(1000 * k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    start.wait()
    while not approved:  # revoke once some uses are through, while the others go on
        pass
    assert store.revoke(grant, "USUPPORT")
    for thread in threads:
        thread.join()
    revoked_at = stored(store, grant.id).revoked_at
    assert approved and all(r.decided_at <= revoked_at for r in approved)
    assert stored(store, grant.id).uses == len(approved) < 400


def test_a_grant_covers_its_requester_in_their_own_workspace_only(redis_conn: redis.Redis) -> None:
    grant = make_grant(GrantStore(redis_conn))
    assert grant.matches("create_ticket", "UALICE", "", {"project": "IT"}, "T1")
    # the same user id in another workspace (or none, as the console's) is another person
    assert not grant.matches("create_ticket", "UALICE", "", {"project": "IT"}, "T2")
    assert not grant.matches("create_ticket", "UALICE", "", {"project": "IT"}, "")


def test_a_tool_that_starts_acting_as_the_person_is_another_contract() -> None:
    from tools.registry import Tool

    def handler(ctx: Any, args: dict[str, Any]) -> str:
        return "ok"

    params = {"type": "object", "properties": {}, "additionalProperties": False}
    own = Tool(name="t", description="d", parameters=params, effect="write", handler=handler)
    theirs = Tool(
        name="t",
        description="d",
        parameters=params,
        effect="write",
        handler=handler,
        connection="github",
    )
    assert own.contract_digest != theirs.contract_digest


def test_approvers_granting_at_once_never_pass_the_cap(redis_conn: redis.Redis) -> None:
    """The count and the add are one step: a count taken before another approver's grant was
    added let both through (MAX_LIVE + 1)."""
    store = GrantStore(redis_conn)
    for _ in range(MAX_LIVE - 1):
        make_grant(store)
    start = threading.Barrier(16)
    made: list[str] = []
    refused: list[str] = []

    def grant() -> None:
        start.wait()
        try:
            made.append(make_grant(store).id)
        except TooManyGrants:
            refused.append("refused")

    threads = [threading.Thread(target=grant) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(made), len(refused)) == (1, 15)
    assert redis_conn.zcard(store.keys.grants_of("UALICE")) == MAX_LIVE  # not capped reading
