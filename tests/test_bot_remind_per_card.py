"""Reminders and escalations per card and per approver, not per item (issue 21, item 3): one
turn that proposes 8 writes with `remind_after: 0` once sent 8 DMs to each of 3 approvers,
and one person could make the bot send thousands a minute. Now each approver gets one DM
per card naming its calls, and at most one reminder (and one escalation) DM a minute
however many cards wait. Over the real loop: Bolt over signed HTTP, FakeSlack (which
records every DM), FakeOpenAI, Redis, RQ."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis

from bot.outbound import reminder_dms as reminders
from bot.render.blocks import APPROVE_ALL
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_events import app_mention
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, SUPPORT, SUPPORT2, BotEnv, bot_env, has_button
from worker.sweeper import Sweeper

MANAGER = "UMANAGER"
APPROVERS = (SUPPORT, SUPPORT2, MANAGER)

EIGHT = Turn(
    tool_calls=[
        ("create_ticket", {"project": "IT", "title": f"ticket {n}", "body": "please"})
        for n in range(8)
    ]
)


def policy(rule: str) -> str:
    return f"""\
roles:
  support: ["@support-team"]
  managers: [{MANAGER}]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support, managers]
    self_approval: false
    {rule}
defaults:
  read: {{allow: [everyone]}}
  write: {{allow: [everyone]}}
"""


@pytest.fixture
def make_env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[Callable[[str], AbstractContextManager[BotEnv]]]:
    def make(rule: str) -> AbstractContextManager[BotEnv]:
        return bot_env(redis_conn, model_server.url, tmp_path, policy=policy(rule))

    yield make


def dms_to(env: BotEnv, user: str) -> list[dict]:
    return [c for c in env.slack.calls("chat.postMessage") if c["channel"] == user]


def ask_for_eight(env: BotEnv, model_server: FakeOpenAI, text: str) -> None:
    model_server.route(text, [EIGHT, "Filed."])
    mention = app_mention(f"<@UBOT> {text}", user=ALICE)
    before = len(env.runs())
    env.event(mention)
    env.wait_for_runs(before + 1)
    env.work()  # the run posts its batch card and schedules the reminders; `0` runs them now
    env.slack.wait_for_call(
        "chat.postMessage",
        lambda a: has_button(APPROVE_ALL)(a) and a.get("thread_ts") == mention["ts"],
    )
    env.work()


def test_an_eight_write_turn_sends_each_approver_one_reminder_naming_the_eight(
    make_env, model_server: FakeOpenAI
) -> None:
    with make_env("remind_after: 0") as env:
        ask_for_eight(env, model_server, "file eight tickets")
        for approver in APPROVERS:
            [dm] = dms_to(env, approver)
            assert "8 calls" in dm["text"] and "create_ticket" in dm["text"]
            assert "Open the card" in dm["text"]
        assert dms_to(env, ALICE) == []
        [run] = env.runs()
        reminded = [e for e in env.rt.events.read(run.id) if e.kind == "approval_reminded"]
        assert len(reminded) == 8  # the audit trail still names every request


def test_a_second_card_within_the_interval_sends_no_second_reminder_to_anyone(
    make_env, model_server: FakeOpenAI
) -> None:
    with make_env("remind_after: 0") as env:
        ask_for_eight(env, model_server, "file eight tickets")
        ask_for_eight(env, model_server, "file eight more tickets")
        assert [len(dms_to(env, a)) for a in APPROVERS] == [1, 1, 1]


def test_escalating_an_eight_write_turn_tells_each_escalation_approver_once(
    make_env, model_server: FakeOpenAI
) -> None:
    with make_env("escalate_to: [managers]\n    escalate_after: 0") as env:
        ask_for_eight(env, model_server, "file eight tickets")
        [run] = env.runs()
        requests = [env.rt.approvals.get(a) for a in env.rt.store.load(run.id).pending_approvals]
        assert len(requests) == 8 and all(r.escalated for r in requests)
        [dm] = dms_to(env, MANAGER)
        assert "Escalated to you" in dm["text"] and "8 calls" in dm["text"]
        [card_ts] = {c["ts"] for r in requests for c in r.cards}
        redraws = [c for c in env.slack.calls("chat.update") if c["ts"] == card_ts]
        assert len(redraws) == 1  # the shared card is drawn again once, not once per item


def test_what_the_cap_held_back_comes_in_one_digest_per_person_after_the_interval(
    make_env, model_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reminders, "REMINDER_INTERVAL", 1)  # a second, not a minute
    with make_env("remind_after: 0") as env:
        ask_for_eight(env, model_server, "file eight tickets")
        ask_for_eight(env, model_server, "file eight more tickets")
        assert [len(dms_to(env, a)) for a in APPROVERS] == [1, 1, 1]  # capped
        scheduler = Sweeper(env.rt).scheduler
        assert scheduler.acquire_locks()
        due = time.time() + reminders.REMINDER_INTERVAL
        wait_until(lambda: time.time() > due, what="the end of the interval")
        scheduler.enqueue_scheduled_jobs()
        env.work()
        second_card = env.rt.approvals.get(env.runs()[0].pending_approvals[0]).cards[0]["ts"]
        for approver in APPROVERS:
            first, digest = dms_to(env, approver)  # one per card, no more
            assert "8 calls" in first["text"] and second_card.replace(".", "") not in first["text"]
            assert "8 more calls are waiting for your decision" in digest["text"]
            assert second_card.replace(".", "") in digest["text"]  # the link to that card


def test_a_card_left_undecided_is_reminded_again_at_its_interval_up_to_its_limit(
    make_env, model_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reminders, "REMINDER_INTERVAL", 1)  # the per-person cap: a second
    rule = "remind_after: 0\n    remind_every: 2h\n    remind_limit: 2"
    with make_env(rule) as env:
        ask_for_eight(env, model_server, "file eight tickets")
        registry = env.rt.queue.scheduled_job_registry
        [next_id] = [j for j in registry.get_job_ids() if j.startswith("remind-")]
        job = env.rt.queue.fetch_job(next_id)
        assert job is not None and next_id.endswith("-1")
        due = registry.get_expiration_time(job).timestamp()
        assert 2 * 3600 - 60 < due - time.time() <= 2 * 3600  # in two hours
        past = time.time() + reminders.REMINDER_INTERVAL
        wait_until(lambda: time.time() > past, what="the per-person interval to pass")
        registry.remove(job)  # the two hours are up: what RQ's scheduler does then
        env.rt.queue.enqueue_job(job)
        env.work()
        assert [len(dms_to(env, a)) for a in APPROVERS] == [2, 2, 2]
        assert [j for j in registry.get_job_ids() if j.startswith("remind-")] == []  # the limit
