"""worker.standing.grantor_unfit: a grant covers a call only while its grantor could approve
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
from worker.standing import grantor_unfit


@pytest.fixture
def rt(redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path) -> Iterator[Runtime]:
    declare_note(NOTE_SCHEMA)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    try:
        yield make_runtime(redis_conn, model_server.url, policy_file=policy)
    finally:
        registry.unregister("file_note")


def made(rt: Runtime, grantor_team: str = "T0001") -> tuple[Grant, ApprovalRequest]:
    tool = registry.get("file_note")
    assert tool is not None
    grant = rt.grants.create(
        tool="file_note",
        requester=ALICE,
        team_id="T0001",
        grantor=SUPPORT,
        grantor_team=grantor_team,
        scope="hour",
        thread="",
        constraint=Constraint.of({"project": "IT", "title": "x"}, {"title"}),
        policy_version=rt.policy.version,
        tool_digest=tool.contract_digest,
        approval_id="ap_first",
        run_id="r1",
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
    held = {SUPPORT: frozenset({"everyone", "support"})}

    def resolver(who: Requester) -> frozenset[str]:
        asked.append(who)
        if who.user_id not in held:
            raise RolesUnavailable("Slack did not answer")
        return held[who.user_id]

    rt.roles = resolver
    grant, request = made(rt)
    assert grantor_unfit(rt, grant, request) is None
    assert asked[-1].user_id == SUPPORT and EXTERNAL not in asked[-1].roles

    held[SUPPORT] = frozenset({"everyone"})  # left @support-team
    assert grantor_unfit(rt, grant, request) == "grantor_roles"

    del held[SUPPORT]
    assert grantor_unfit(rt, grant, request) == "grantor_unconfirmed"

    held[SUPPORT] = frozenset({"everyone", "support"})
    other_org, _ = made(rt, grantor_team="T0OTHER")  # Slack Connect: held to the external rule
    assert grantor_unfit(rt, other_org, request) is None
    assert EXTERNAL in asked[-1].roles
