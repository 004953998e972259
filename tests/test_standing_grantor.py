"""worker.standing.Grantors: a grant covers a call only while its grantor could approve
the call now; their roles come from the runtime's resolver (Slack's user groups in the bot
and workers), and a resolver that cannot say covers nothing (tests/test_bot_grants.py drives
the user-group case end to end through Slack)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from approvals import ApprovalRequest
from approvals.grants import Constraint, Grant
from approvals.store import new_request
from tests.fakes.openai_server import FakeOpenAI
from tests.support.grants import NOTE_SCHEMA, POLICY, declare_note
from tests.support.runtime import make_runtime
from tests.support.slack_bot import ALICE, SUPPORT
from tools.policy import EXTERNAL
from tools.registry import registry
from worker.roles import RolesUnavailable
from worker.run import Requester
from worker.runtime import Runtime
from worker.standing import UNCONFIRMED, Grantors


@pytest.fixture
def rt(redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path) -> Iterator[Runtime]:
    declare_note(NOTE_SCHEMA)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    try:
        yield make_runtime(redis_conn, model_server.url, policy_file=policy)
    finally:
        registry.unregister("file_note")


def made(rt: Runtime, grantor_external: bool = False) -> tuple[Grant, ApprovalRequest]:
    tool = registry.get("file_note")
    assert tool is not None
    grant = rt.grants.create(
        tool="file_note",
        requester=ALICE,
        team_id="T0001",
        grantor=SUPPORT,
        grantor_team="T0OTHER" if grantor_external else "T0001",
        scope="hour",
        thread="",
        constraint=Constraint.of({"project": "IT", "title": "x"}, {"title"}),
        policy_version=rt.policy.version,
        tool_digest=tool.contract_digest,
        approval_id="ap_first",
        run_id="r1",
        grantor_external=grantor_external,
    )
    request = new_request(
        approval_id="ap_next",
        run_id="r2",
        call_id="c1",
        tool="file_note",
        args={"project": "IT", "title": "y"},
        requester=ALICE,
        team_id="T0001",
        channel_id="C0001",
        policy_version=rt.policy.version,
        ttl=60,
    )
    return grant, request


def test_the_grantors_roles_now_decide_and_a_resolver_that_cannot_say_covers_nothing(
    rt: Runtime,
) -> None:
    asked: list[Requester] = []
    groups = {SUPPORT: {"support"}}  # the user groups' roles Slack gives them

    def resolver(who: Requester) -> frozenset[str]:  # as bot.state.identity's
        asked.append(who)
        if who.user_id not in groups:
            raise RolesUnavailable("Slack did not answer")
        if EXTERNAL in who.roles:  # another organization: none of our groups
            return frozenset({"everyone", EXTERNAL})
        return frozenset({"everyone", *groups[who.user_id]})

    rt.roles = resolver
    grant, request = made(rt)
    assert Grantors(rt).unfit(grant, request) is None
    assert asked[-1].user_id == SUPPORT and EXTERNAL not in asked[-1].roles

    groups[SUPPORT] = set()  # left @support-team
    assert Grantors(rt).unfit(grant, request) == "grantor_roles"

    del groups[SUPPORT]
    assert Grantors(rt).unfit(grant, request) == UNCONFIRMED

    groups[SUPPORT] = {"support"}
    external, _ = made(rt, grantor_external=True)  # made from another organization
    stored = rt.grants.find(external.id)
    assert stored is not None and stored.grantor_external
    assert Grantors(rt).unfit(external, request) == "grantor_roles"  # no group roles for them
    assert EXTERNAL in asked[-1].roles


def test_roles_are_read_once_per_grantor_within_one_look(rt: Runtime) -> None:
    asked: list[str] = []

    def resolver(who: Requester) -> frozenset[str]:
        asked.append(who.user_id)
        return frozenset({"everyone", "support"})

    rt.roles = resolver
    grant, request = made(rt)
    another, _ = made(rt)
    grantors = Grantors(rt)
    assert grantors.unfit(grant, request) is None and grantors.unfit(another, request) is None
    assert asked == [SUPPORT]
