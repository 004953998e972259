"""Roles follow Slack's user groups with a bounded staleness, at the click and at execution,
and fail closed when Slack cannot be asked (issue 15, item 5)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from slack_sdk import WebClient

from approvals import ApprovalStatus
from bot.render import messages as m
from bot.render.blocks import APPROVE
from bot.state.identity import RETRY_SECONDS, UserGroups
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import FakeSlack, app_mention
from tests.support.runtime import wait_until
from tests.support.slack_bot import (
    ADMIN,
    ALICE,
    CHANNEL,
    SUPPORT,
    SUPPORT2,
    TOKEN,
    USERGROUPS,
    BotEnv,
    bot_env,
    buttons,
    has_button,
)
from tools.builtin.tickets import TicketStore
from worker.roles import RolesUnavailable
from worker.run import EndReason, RunStatus

CREATE = Turn(
    tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down", "body": "since 9am"})]
)

# Only the support group may file tickets; admins approve them.
SUPPORT_FILES = """\
roles:
  admins: [UADMIN]
  support: ["@support-team"]
admins: [admins]
tools:
  create_ticket:
    allow: [support]
    approvers: [admins]
defaults:
  read: {allow: [everyone]}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(usergroups=USERGROUPS) as fake:
        yield fake


def groups(slack: FakeSlack, clock: Clock, **kwargs: object) -> UserGroups:
    return UserGroups(WebClient(token=TOKEN, base_url=slack.url), ttl=60, clock=clock, **kwargs)  # type: ignore[arg-type]


def remove_from_support(slack: FakeSlack, user: str) -> None:
    [group] = USERGROUPS
    slack.add_usergroup(group["id"], group["handle"], [u for u in group["users"] if u != user])


# -- the cache --------------------------------------------------------------------------------


def test_membership_is_read_again_once_half_the_bound_has_passed(slack: FakeSlack) -> None:
    clock = Clock()
    cache = groups(slack, clock)
    assert cache.handles_of(SUPPORT) == {"@support-team"}
    remove_from_support(slack, SUPPORT)

    clock.now += 29
    assert cache.handles_of(SUPPORT) == {"@support-team"}  # within the bound: cached
    assert len(slack.calls("usergroups.list")) == 1
    clock.now += 2
    # 31 s: asked again in the background; what is held (within the bound) serves meanwhile
    assert cache.handles_of(SUPPORT) in ({"@support-team"}, frozenset())
    wait_until(lambda: cache.handles_of(SUPPORT) == frozenset(), what="the new membership")
    assert len(slack.calls("usergroups.list")) == 2

    clock.now += 61  # past the bound: the caller waits for Slack rather than use old news
    slack.add_usergroup("S0SUPPORT", "support-team", [SUPPORT])
    assert cache.handles_of(SUPPORT) == {"@support-team"}


def test_while_slack_fails_the_cache_serves_to_the_bound_then_fails_closed(
    slack: FakeSlack,
) -> None:
    clock = Clock()
    cache = groups(slack, clock)
    assert cache.handles_of(SUPPORT) == {"@support-team"}
    slack.fail("usergroups.list", "ratelimited", times=100)

    clock.now += 45
    assert cache.handles_of(SUPPORT) == {"@support-team"}  # 45 s old: still within 60
    wait_until(lambda: len(slack.calls("usergroups.list")) == 2, what="the failed refresh")
    clock.now += 16
    with pytest.raises(RolesUnavailable, match="61 s"):
        cache.handles_of(SUPPORT)
    slack.reset()  # Slack answers again: so does the cache, at its next try
    clock.now += RETRY_SECONDS
    assert cache.handles_of(SUPPORT) == {"@support-team"}


def test_never_read_and_slack_failing_fails_closed_then_recovers(slack: FakeSlack) -> None:
    clock = Clock()
    cache = groups(slack, clock)
    slack.fail("usergroups.list", "missing_scope", times=1)
    with pytest.raises(RolesUnavailable, match="ever"):
        cache.handles_of(SUPPORT)
    clock.now += 1  # sooner than the retry interval: Slack is not asked again
    with pytest.raises(RolesUnavailable):
        cache.handles_of(SUPPORT)
    assert len(slack.calls("usergroups.list")) == 1
    clock.now += RETRY_SECONDS
    assert cache.handles_of(SUPPORT) == {"@support-team"}


def test_processes_share_one_read_through_redis(slack: FakeSlack, redis_conn: redis.Redis) -> None:
    clock = Clock()
    first = groups(slack, clock, shared=redis_conn, namespace="sbroles:")
    second = groups(slack, clock, shared=redis_conn, namespace="sbroles:")
    assert first.handles_of(SUPPORT) == {"@support-team"}
    wait_until(lambda: redis_conn.exists("sbroles:usergroups"), what="the shared copy")
    assert second.handles_of(SUPPORT2) == {"@support-team"}
    assert len(slack.calls("usergroups.list")) == 1  # the second read Redis, not Slack

    redis_conn.set("sbroles:usergroups", b"{not json")  # a bad copy is ignored, not trusted
    clock.now += 61
    assert second.handles_of(SUPPORT) == {"@support-team"}
    assert len(slack.calls("usergroups.list")) == 2


def test_a_shared_copy_is_as_old_as_redis_says_whatever_the_writers_clock(
    slack: FakeSlack, redis_conn: redis.Redis
) -> None:
    """A writer whose clock runs an hour fast must not make its copy look fresh for an hour."""
    fast, slow = Clock(), Clock()
    fast.now += 3600
    writer = groups(slack, fast, shared=redis_conn, namespace="sbskew:")
    reader = groups(slack, slow, shared=redis_conn, namespace="sbskew:")
    writer.handles_of(SUPPORT)
    wait_until(lambda: redis_conn.exists("sbskew:usergroups"), what="the shared copy")
    assert reader.handles_of(SUPPORT) == {"@support-team"}
    remove_from_support(slack, SUPPORT)
    redis_conn.delete("sbskew:usergroups")  # as Redis does once its 60 s are up
    slow.now += 61  # a minute later by the reader's clock, what it holds is past its bound
    assert reader.handles_of(SUPPORT) == frozenset()


# -- at the click -----------------------------------------------------------------------------


@pytest.fixture
def fresh(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    """The bot with no group cache to speak of: every check asks Slack (bound 0 s)."""
    with bot_env(redis_conn, model_server.url, tmp_path, groups_ttl=0) as env:
        yield env


def card(env: BotEnv, user: str = ALICE) -> tuple[dict, str, str]:
    mention = app_mention("<@UBOT> please file a ticket: VPN is down", user=user)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    posted = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
    approval_id = buttons(posted["blocks"])[APPROVE]
    [stored] = env.rt.approvals.get(approval_id).cards
    return mention, approval_id, stored["ts"]


def test_a_removed_approver_is_refused_at_once(fresh: BotEnv, model_server: FakeOpenAI) -> None:
    model_server.route("VPN", [CREATE, "Filed."])
    _, approval_id, card_ts = card(fresh)
    remove_from_support(fresh.slack, SUPPORT)

    fresh.click(APPROVE, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    refusal = fresh.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == SUPPORT)
    assert "@support" in refusal["text"]
    assert fresh.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING


def test_a_click_while_slack_cannot_say_who_is_in_which_group_decides_nothing(
    fresh: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "Filed."])
    mention, approval_id, card_ts = card(fresh)
    fresh.slack.fail("usergroups.list", "missing_scope", times=100)

    fresh.click(
        APPROVE, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts, thread_ts=mention["ts"]
    )
    told = fresh.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == SUPPORT)
    assert told["text"] == m.ROLES_UNAVAILABLE and told["thread_ts"] == mention["ts"]
    assert fresh.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_a_question_while_slack_cannot_say_starts_no_run(fresh: BotEnv) -> None:
    fresh.slack.fail("usergroups.list", "missing_scope", times=100)
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    fresh.event(mention)
    told = fresh.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == ALICE)
    assert told["text"] == m.ROLES_UNAVAILABLE and told["channel"] == CHANNEL
    fresh.settle()
    assert fresh.runs() == []


# -- at execution -----------------------------------------------------------------------------


@pytest.fixture
def support_files(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path, policy=SUPPORT_FILES, groups_ttl=0) as env:
        yield env


def test_a_write_approved_after_its_requester_left_the_group_does_not_run(
    support_files: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = support_files
    model_server.route("VPN", [CREATE, "It was not filed."])
    _, approval_id, card_ts = card(env, user=SUPPORT)
    [run] = env.runs()
    assert "support" in run.requester.roles
    remove_from_support(env.slack, SUPPORT)

    env.click(APPROVE, approval_id, ADMIN, channel=CHANNEL, message_ts=card_ts)
    wait_until(lambda: env.rt.approvals.get(approval_id).status == ApprovalStatus.APPROVED)
    env.work()

    run = env.rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert "support" not in run.requester.roles
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0
    kinds = {e.kind: e.data for e in env.rt.events.read(run.id)}
    assert kinds["roles_changed"]["before"] == ["everyone", "support"]
    assert kinds["roles_changed"]["after"] == ["everyone"]
    [tool_message] = [msg for msg in run.messages if msg.get("role") == "tool"]
    assert tool_message["content"].startswith("Not run:")


def test_a_write_whose_requester_cannot_be_checked_does_not_run_and_says_why(
    support_files: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = support_files
    model_server.route("VPN", [CREATE, "never asked"])
    _, approval_id, card_ts = card(env, user=SUPPORT)
    env.click(APPROVE, approval_id, ADMIN, channel=CHANNEL, message_ts=card_ts)
    wait_until(lambda: env.rt.approvals.get(approval_id).status == ApprovalStatus.APPROVED)
    env.slack.fail("usergroups.list", "missing_scope", times=100)
    env.work()

    [run] = env.runs()
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason.ROLES_UNAVAILABLE)
    assert "could not confirm" in run.detail
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0
    assert any(e.kind == "roles_unavailable" for e in env.rt.events.read(run.id))
