"""Per-person limits reached through every way Slack delivers a question (issue 21, not yet
tried): Slack's retries of one event (`X-Slack-Retry-Num`), an edited message (Slack sends a
fresh `app_mention` with a new event id and an `edited` field, and a `message_changed`),
and assistant threads. A retry or an edit must neither count twice nor start a second run,
and the limit must hold in an assistant thread as in a channel. Bolt over signed HTTP,
FakeSlack, Redis, RQ."""

from __future__ import annotations

from typing import Any

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_events import app_mention, event_callback, message_im, next_ts
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, CHANNEL, BotEnv
from worker.limits import Limits

PER_MINUTE = 2


def limit(env: BotEnv) -> None:
    env.rt.settings.limits = env.rt.limits.limits = Limits(runs_per_minute=PER_MINUTE)


def refusals(env: BotEnv) -> list[dict[str, Any]]:
    return [c for c in env.slack.calls("chat.postMessage") if "a minute" in c.get("text", "")]


def test_slacks_retries_of_a_question_count_once_against_the_limit(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    limit(env)
    first = event_callback(app_mention("<@UBOT> first question", user=ALICE))
    for retry in ("", "1", "2", "3"):  # the delivery and Slack's three retries
        headers = {"X-Slack-Retry-Num": retry, "X-Slack-Retry-Reason": "http_timeout"}
        assert env.post(first, headers=headers if retry else {}).status == 200
    env.event(app_mention("<@UBOT> second question", user=ALICE))
    env.wait_for_runs(2)
    env.event(app_mention("<@UBOT> third question", user=ALICE))
    wait_until(lambda: refusals(env), what="the third question refused")
    env.settle()
    assert sorted(r.question for r in env.runs()) == ["first question", "second question"]


def edited(mention: dict[str, Any], text: str) -> list[dict[str, Any]]:
    """What Slack sends when a message that mentions the bot is edited: a fresh app_mention
    (new event id, same ts, `edited`) and a message_changed."""
    stamp = {"user": mention["user"], "ts": next_ts()}
    again = {**mention, "text": text, "edited": stamp}
    changed = {
        "type": "message",
        "subtype": "message_changed",
        "channel": mention["channel"],
        "hidden": True,
        "ts": next_ts(),
        "event_ts": next_ts(),
        "message": {**again, "type": "message"},
        "previous_message": {**mention, "type": "message"},
    }
    return [again, changed]


def test_an_edited_question_starts_no_second_run_and_does_not_count_again(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("question", ["an answer"])
    limit(env)
    mention = app_mention("<@UBOT> first question", user=ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()  # answered: an edit now would not even meet "still working"
    for event in edited(mention, "<@UBOT> first question, edited"):
        env.event(event)
    env.event(app_mention("<@UBOT> second question", user=ALICE))  # within the limit still
    env.wait_for_runs(2)
    env.settle()
    assert sorted(r.question for r in env.runs()) == ["first question", "second question"]
    assert refusals(env) == []


def test_the_limit_holds_in_an_assistant_thread_and_is_said_there(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("assistant question", ["an answer"])
    limit(env)
    thread_ts = next_ts()
    started = {"user_id": ALICE, "channel_id": "D0001", "thread_ts": thread_ts, "context": {}}
    env.event({"type": "assistant_thread_started", "assistant_thread": started})
    env.slack.wait_for_call("assistant.threads.setSuggestedPrompts")
    for n in range(PER_MINUTE):  # a question, its answer, a follow-up, its answer
        env.event(message_im(f"assistant question {n}", user=ALICE, thread_ts=thread_ts))
        env.wait_for_runs(n + 1)
        env.work()
    env.event(message_im("assistant question, one too many", user=ALICE, thread_ts=thread_ts))
    [told] = wait_until(lambda: refusals(env), what="the refusal")
    assert told["channel"] == "D0001" and told["thread_ts"] == thread_ts
    env.settle()
    assert len(env.runs()) == PER_MINUTE  # one run per message: no second path counted it
    assert env.slack.assistant_thread("D0001", thread_ts)["status"] == ""
    # ... and the person's other surfaces share the same count
    env.event(app_mention("<@UBOT> from a channel", user=ALICE, channel=CHANNEL))
    wait_until(lambda: len(refusals(env)) == 2, what="the channel question refused too")
