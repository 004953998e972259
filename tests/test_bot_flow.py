"""The Slack surface end to end: signed requests over HTTP to the real Bolt app, FakeSlack for
the Web API, FakeOpenAI for the model, a real Redis and RQ SimpleWorker, SQLite tickets."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from approvals import ApprovalStatus
from bot.render.blocks import APPROVE, CANCEL, REJECT, REJECT_MODAL, VIEW_RUN
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import (
    app_mention,
    assistant_thread_started,
    block_actions,
    event_callback,
    message,
    message_im,
    next_ts,
    send_signed,
    view_submission,
)
from tests.support.runtime import wait_until
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    STRANGER,
    SUPPORT,
    SUPPORT2,
    BotEnv,
    buttons,
    has_button,
    texts,
)
from tools.builtin.tickets import TicketStore
from worker.run import RunStatus

CREATE = Turn(
    tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down", "body": "since 9am"})]
)
ASK_TICKET = "<@UBOT> please file a ticket: VPN is down"


def suspended_on_card(env: BotEnv, text: str = ASK_TICKET) -> tuple[dict, str, str]:
    """Mention the bot, run the worker until it waits: (mention event, approval id, card ts)."""
    mention = app_mention(text, user=ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    card = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
    assert card["thread_ts"] == mention["ts"]
    approval_id = buttons(card["blocks"])[APPROVE]
    [stored] = env.rt.approvals.get(approval_id).cards
    return mention, approval_id, stored["ts"]


def to_user(user: str) -> Callable[[dict[str, Any]], bool]:
    return lambda args: bool(args["user"] == user)


def card_updates(env: BotEnv, card_ts: str) -> list[dict]:
    return [c for c in env.slack.calls("chat.update") if c["ts"] == card_ts]


# Must show 1 --------------------------------------------------------------------------------------


def test_mention_approval_click_runs_the_tool_once_and_answers_in_the_thread(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "I filed ticket #1 for the VPN outage."])
    mention, approval_id, card_ts = suspended_on_card(env)

    [run] = env.runs()
    assert run.question == "please file a ticket: VPN is down"  # the mention is not the question
    assert (run.requester.user_id, run.requester.team_id, run.requester.channel_id) == (
        ALICE,
        "T0001",
        CHANNEL,
    )
    assert run.status == RunStatus.AWAITING_APPROVAL
    card = env.slack.message(CHANNEL, card_ts)
    assert card is not None
    shown = texts(card["blocks"])
    for expected in ("create_ticket", "<@UALICE>", '"title": "VPN is down"', "@support", "Expires"):
        assert expected in shown
    assert set(buttons(card["blocks"]).values()) == {approval_id}  # the value is only the id
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0

    env.click(
        APPROVE, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts, thread_ts=mention["ts"]
    )
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Approved by <@USUPPORT>" in texts(a)
    )
    assert APPROVE not in buttons(updated["blocks"]) and REJECT not in buttons(updated["blocks"])

    env.work()
    answer = env.slack.wait_for_message(
        CHANNEL,
        lambda m: m.get("thread_ts") == mention["ts"] and VIEW_RUN in buttons(m.get("blocks", [])),
    )
    assert "I filed ticket #1 for the VPN outage." in texts(answer["blocks"])
    footer = texts([b for b in answer["blocks"] if b["type"] == "context"])
    for expected in ("2 steps", "tools: create_ticket", "tokens", "$", "working"):
        assert expected in footer
    assert buttons(answer["blocks"])[VIEW_RUN] == run.id
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1

    run = env.rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    status = env.slack.message(CHANNEL, run.origin["status_ts"])
    assert status is not None and status.get("thread_ts") == mention["ts"]
    assert "Done" in texts(status["blocks"]) and CANCEL not in buttons(status["blocks"])


# Must show 2 --------------------------------------------------------------------------------------


def test_a_click_by_someone_not_allowed_is_refused_and_changes_nothing(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "Ticket filed."])
    _, approval_id, card_ts = suspended_on_card(env)

    for user in (ALICE, STRANGER):  # the requester may not approve her own call here
        env.click(APPROVE, approval_id, user, channel=CHANNEL, message_ts=card_ts)
        refusal = env.slack.wait_for_call("chat.postEphemeral", to_user(user))
        assert refusal["channel"] == CHANNEL and "@support" in refusal["text"]
    env.click(REJECT, approval_id, STRANGER, channel=CHANNEL, message_ts=card_ts)
    env.slack.wait_for_call(
        "chat.postEphemeral",
        lambda a: a["user"] == STRANGER and len(env.slack.calls("chat.postEphemeral")) == 3,
    )

    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING
    assert card_updates(env, card_ts) == []
    assert env.slack.calls("views.open") == []
    assert env.rt.queue.count == 0
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_two_allowed_clicks_make_one_decision_and_one_execution(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "Ticket filed."])
    _, approval_id, card_ts = suspended_on_card(env)

    def click(user: str) -> None:
        env.click(APPROVE, approval_id, user, channel=CHANNEL, message_ts=card_ts)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(click, [SUPPORT, SUPPORT2]))
    told = env.slack.wait_for_call("chat.postEphemeral", lambda a: "already" in a["text"])
    wait_until(lambda: env.rt.queue.count == 1, what="the winner's advance job")

    [run] = env.runs()
    decided = [e for e in env.rt.events.read(run.id) if e.kind == "approval_decided"]
    assert len(decided) == 1
    winner = decided[0].data["by"]
    assert {winner, told["user"]} == {SUPPORT, SUPPORT2}
    assert f"Approved by <@{winner}>" in told["text"]  # the loser learns who decided

    env.work()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1


def test_reject_asks_for_a_reason_that_reaches_the_card_and_the_model(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "Support rejected the ticket, so I did not file it."])
    mention, approval_id, card_ts = suspended_on_card(env)

    env.click(
        REJECT, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts, thread_ts=mention["ts"]
    )
    opened = env.slack.wait_for_call("views.open")
    view = opened["view"]
    assert view["callback_id"] == REJECT_MODAL
    response = env.post(
        view_submission(
            REJECT_MODAL,
            {
                "reason": {
                    "reason": {"type": "plain_text_input", "value": "Use the IT portal <!channel>"}
                }
            },
            user_id=SUPPORT,
            private_metadata=view["private_metadata"],
        )
    )
    assert response.status == 200
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Rejected by <@USUPPORT>" in texts(a)
    )
    assert "Use the IT portal &lt;!channel&gt;" in texts(updated["blocks"])  # escaped, no ping
    assert "<!channel>" not in texts(updated["blocks"])

    env.work()
    observed = [
        m["content"] for m in model_server.last_chat_request["messages"] if m["role"] == "tool"
    ]
    assert "rejected" in observed[0] and "Use the IT portal" in observed[0]
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


# Must show 3 --------------------------------------------------------------------------------------


def test_an_event_delivered_three_times_creates_one_run(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    body = event_callback(app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE))
    deliveries = [
        {},
        {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"},
        {"X-Slack-Retry-Num": "2", "X-Slack-Retry-Reason": "http_timeout"},
    ]
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda h: env.post(body, headers=h), deliveries))
    assert [r.status for r in responses] == [200, 200, 200]

    env.wait_for_runs(1)
    wait_until(lambda: env.rt.queue.count >= 1, what="the run's job")  # created, then enqueued
    assert len(env.runs()) == 1
    assert env.rt.queue.count == 1
    assert env.rt.redis.exists(f"sb:slack:event:{body['event_id']}")


# Must show 4 --------------------------------------------------------------------------------------


def test_forged_or_stale_requests_are_refused_and_nothing_is_enqueued(
    env: BotEnv, redis_conn: redis.Redis
) -> None:
    event = event_callback(app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE))
    forged = send_signed(env.url, "not-the-signing-secret", event)
    stale = env.post(event, timestamp=int(time.time()) - 6 * 60)
    click = send_signed(env.url, "not-the-signing-secret", block_actions(APPROVE, "ap_" + "0" * 20))
    assert [forged.status, stale.status, click.status] == [401, 401, 401]

    assert env.runs() == []
    assert env.rt.queue.count == 0
    assert redis_conn.keys("sb:slack:*") == []
    # start-up only: Bolt checks the token, the bot learns its team and app
    assert {c.method for c in env.slack.call_log} == {"auth.test", "bots.info"}


def test_healthz_and_unknown_paths(env: BotEnv) -> None:
    import urllib.error
    import urllib.request

    base = env.url.removesuffix("/slack/events")
    with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/nope", timeout=5)
    assert missing.value.code == 404


# Must show 5 --------------------------------------------------------------------------------------


def test_a_thread_reply_continues_the_conversation_with_its_history(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    first, second = "What does SQL Basics cost?", "And together with Python Basics?"
    model_server.route(first, ["SQL Basics costs 2499."])
    model_server.route(second, ["Together they cost 4498."])
    mention = app_mention(f"<@UBOT> {first}", user=ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    env.slack.wait_for_message(CHANNEL, lambda m: "2499" in texts(m.get("blocks", [])))

    env.event(message(second, user=ALICE, thread_ts=mention["ts"]))
    runs = env.wait_for_runs(2)
    env.work()
    env.slack.wait_for_message(CHANNEL, lambda m: "4498" in texts(m.get("blocks", [])))

    reply_run = next(r for r in runs if r.question == second)
    first_run = next(r for r in runs if r.question == first)
    assert reply_run.parent_id == first_run.id
    assert reply_run.origin["thread_ts"] == mention["ts"]
    sent = [
        (m["role"], m["content"])
        for m in model_server.last_chat_request["messages"]
        if m["role"] in ("user", "assistant")
    ]
    assert sent[-3:] == [("user", first), ("assistant", "SQL Basics costs 2499."), ("user", second)]
    answers = [
        m
        for m in env.slack.thread(CHANNEL, mention["ts"])
        if VIEW_RUN in buttons(m.get("blocks", []))
    ]
    assert len(answers) == 2


def test_a_dm_and_an_assistant_thread_get_answers_and_status(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("SQL Basics", ["SQL Basics costs 2499."])
    model_server.route("Python Basics", ["Python Basics costs 1999."])
    thread_ts = next_ts()
    env.event(assistant_thread_started(thread_ts, user=ALICE))
    prompts = env.slack.wait_for_call("assistant.threads.setSuggestedPrompts")
    assert prompts["thread_ts"] == thread_ts and prompts["prompts"]

    env.event(message_im("What does SQL Basics cost?", user=ALICE, thread_ts=thread_ts))
    env.slack.wait_for_call("assistant.threads.setStatus", lambda a: bool(a["status"]))
    [run] = env.wait_for_runs(1)
    assert run.origin["assistant"] == "1"
    env.work()
    env.slack.wait_for_message("D0001", lambda m: "2499" in texts(m.get("blocks", [])))
    state = env.slack.assistant_thread("D0001", thread_ts)
    assert state["status"] == "" and state["title"] == "What does SQL Basics cost?"

    dm = message_im("What does Python Basics cost?", user=ALICE, channel="D0002")
    env.event(dm)
    env.wait_for_runs(2)
    env.work()
    answer = env.slack.wait_for_message("D0002", lambda m: "1999" in texts(m.get("blocks", [])))
    assert answer["thread_ts"] == dm["ts"]


def test_an_overlong_question_is_answered_with_the_limit(env: BotEnv) -> None:
    mention = app_mention("<@UBOT> " + "x" * 5000, user=ALICE)
    env.event(mention)
    told = env.slack.wait_for_call("chat.postMessage", lambda a: "limit" in a.get("text", ""))
    assert told["thread_ts"] == mention["ts"]
    assert env.runs() == []


def test_cancel_from_the_status_message_withdraws_the_card_and_says_why(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "Ticket filed."])
    mention, approval_id, card_ts = suspended_on_card(env)
    [run] = env.runs()
    status_ts = run.origin["status_ts"]

    env.click(CANCEL, run.id, STRANGER, channel=CHANNEL, message_ts=status_ts)
    refused = env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == STRANGER)
    assert "Only the person who asked or an admin" in refused["text"]
    env.click(CANCEL, run.id, ALICE, channel=CHANNEL, message_ts=status_ts)
    env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == ALICE)
    env.work()

    assert env.rt.store.load(run.id).status == RunStatus.PARTIAL
    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.WITHDRAWN
    withdrawn = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Withdrawn" in texts(a)
    )
    assert "run was cancelled" in texts(withdrawn["blocks"]) and not buttons(withdrawn["blocks"])
    ending = env.slack.wait_for_message(
        CHANNEL, lambda m: "I stopped before finishing" in texts(m.get("blocks", []))
    )
    assert "<@UALICE> cancelled the run" in texts(ending["blocks"])
    assert ending["thread_ts"] == mention["ts"]
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_the_bots_own_port_serves_metrics_and_times_its_acks(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    import urllib.request

    model_server.route("2 + 3", [Turn(tool_calls=[("calculate", {"expression": "2 + 3"})]), "5"])
    model_server.route("VPN is down", [CREATE, "Filed."])
    env.event(app_mention("<@UBOT> what is 2 + 3?", user=ALICE))
    env.wait_for_runs(1)
    env.work()
    suspended_on_card(env)
    metrics_url = env.url.replace("/slack/events", "/metrics")
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines['switchboard_runs_total{status="completed"}']) >= 1
    assert float(lines["switchboard_approvals_pending"]) >= 1
    assert "switchboard_queue_depth" in lines
    assert float(lines["switchboard_model_call_seconds_count"]) >= 2
    assert float(lines["switchboard_slack_ack_seconds_count"]) >= 2  # the two mentions
