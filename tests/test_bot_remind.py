"""Reminders and escalation, end to end: the policy's remind_after DMs the approvers a link
to the card; escalate_to lets that role decide after escalate_after, and not before. The
jobs are scheduled as expiry is and moved to the queue by RQ's scheduler, as every
worker's sweeper runs it (Bolt over signed HTTP, FakeSlack, FakeOpenAI, Redis, RQ)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import tools.builtin
from approvals import ApprovalStatus
from bot.render.blocks import APPROVE
from tests.fakes.openai_server import FakeOpenAI
from tests.support.runtime import wait_until
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    SUPPORT,
    SUPPORT2,
    BotEnv,
    bot_env,
    buttons,
    texts,
)
from tests.test_bot_flow import CREATE, suspended_on_card
from tools.builtin.tickets import TicketStore
from tools.exceptions import PolicyError
from tools.policy import Policy
from tools.registry import registry
from worker.run import RunStatus
from worker.sweeper import Sweeper

tools.builtin.load()  # the policy tests below name create_ticket

MANAGER = "UMANAGER"
REMIND, ESCALATE = 0.5, 2.0

POLICY = f"""\
roles:
  support: ["@support-team"]
  managers: [{MANAGER}]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support]
    self_approval: false
    remind_after: {REMIND}
    escalate_to: [managers]
    escalate_after: {ESCALATE}s
defaults:
  read: {{allow: [everyone]}}
  write: {{allow: [everyone]}}
"""


@pytest.fixture
def remind_env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY) as bot:
        yield bot


def dms_to(env: BotEnv, user: str) -> list[dict]:
    return [c for c in env.slack.calls("chat.postMessage") if c["channel"] == user]


def test_reminders_go_to_the_approvers_and_escalation_lets_the_role_decide_only_after(
    remind_env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = remind_env
    model_server.route("VPN", [CREATE, "Filed after the manager approved."])
    _, approval_id, card_ts = suspended_on_card(env)
    request = env.rt.approvals.get(approval_id)
    scheduler = Sweeper(env.rt).scheduler
    assert scheduler.acquire_locks()

    # before the wait the manager is not an approver
    env.click(APPROVE, approval_id, MANAGER, channel=CHANNEL, message_ts=card_ts)
    refusal = env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == MANAGER)
    assert "@support" in refusal["text"]
    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING

    wait_until(lambda: time.time() > request.created_at + REMIND, what="the reminder's time")
    scheduler.enqueue_scheduled_jobs()
    env.work()
    link = f"https://fake-workspace.slack.com/archives/{CHANNEL}/p{card_ts.replace('.', '')}"
    for approver in (SUPPORT, SUPPORT2):
        [dm] = dms_to(env, approver)
        assert link in dm["text"] and "create_ticket" in dm["text"]
    assert dms_to(env, ALICE) == []  # she may not approve her own call

    wait_until(lambda: time.time() > request.created_at + ESCALATE, what="the escalation's time")
    scheduler.enqueue_scheduled_jobs()
    env.work()
    assert env.rt.approvals.get(approval_id).escalated
    [dm] = dms_to(env, MANAGER)
    assert "Escalated to you" in dm["text"] and link in dm["text"]
    card = env.slack.wait_for_call("chat.update", lambda a: a["ts"] == card_ts)
    assert "(escalated) @managers" in texts(card["blocks"]) and APPROVE in buttons(card["blocks"])

    env.click(APPROVE, approval_id, MANAGER, channel=CHANNEL, message_ts=card_ts)
    wait_until(
        lambda: env.rt.approvals.get(approval_id).status == ApprovalStatus.APPROVED,
        what="the manager's approval",
    )
    env.work()
    [run] = env.runs()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
    kinds = [e.kind for e in env.rt.events.read(run.id)]
    assert kinds.index("approval_reminded") < kinds.index("approval_escalated")
    [decided] = [e for e in env.rt.events.read(run.id) if e.kind == "approval_decided"]
    assert decided.data["by"] == MANAGER


def test_a_reminder_after_a_decision_sends_nothing(
    remind_env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = remind_env
    model_server.route("VPN", [CREATE, "Filed."])
    _, approval_id, card_ts = suspended_on_card(env)
    request = env.rt.approvals.get(approval_id)
    env.click(APPROVE, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    wait_until(lambda: env.rt.approvals.get(approval_id).decided, what="the decision")
    wait_until(lambda: time.time() > request.created_at + ESCALATE, what="both wait times")
    scheduler = Sweeper(env.rt).scheduler
    assert scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()
    env.work()
    assert [dms_to(env, u) for u in (SUPPORT, SUPPORT2, MANAGER)] == [[], [], []]
    assert not env.rt.approvals.get(approval_id).escalated


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("remind_after: soon", "remind_after must be a duration"),
        ("escalate_to: [support]", "escalate_to and escalate_after go together"),
        ("escalate_after: 1h", "escalate_to and escalate_after go together"),
        ("escalate_to: [bosses]\n    escalate_after: 1h", "unknown role 'bosses'"),
    ],
)
def test_reminder_keys_in_the_policy_are_checked(rule: str, error: str) -> None:
    text = (
        f"roles:\n  support: [U1]\ntools:\n  create_ticket:\n    approvers: [support]\n    {rule}\n"
    )
    with pytest.raises(PolicyError, match=error):
        Policy.parse(text, registry)


def test_durations_read_as_seconds() -> None:
    text = (
        "roles:\n  support: [U1]\ntools:\n  create_ticket:\n    approvers: [support]\n"
        "    remind_after: 30m\n    escalate_to: [support]\n    escalate_after: 2h\n"
    )
    rule = Policy.parse(text, registry).rule("create_ticket")
    assert (rule.remind_after, rule.escalate_to, rule.escalate_after) == (1800, ("support",), 7200)
