"""Streamed answers end to end: signed Slack events to the real Bolt app, a real RQ worker, the
real openai client against FakeOpenAI streaming its replies (paced like a model writing), and
the real slack_sdk against FakeSlack's chat.startStream / appendStream / stopStream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from slack_sdk import WebClient

from bot.outbound.answers import AnswerStreams
from bot.outbound.slack_surface import SlackSurface
from bot.render.blocks import VIEW_RUN
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import FakeSlack, app_mention
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE as ALICE_REQUESTER
from tests.support.runtime import make_runtime, wait_until
from tests.support.slack_bot import ALICE, CHANNEL, TOKEN, BotEnv, buttons, texts
from worker import service
from worker.run import Run, RunStatus

ANSWER = (
    "Python Basics is the prerequisite for Django Fundamentals. Take it first: it covers the "
    "language itself, and Django Fundamentals builds on every part of it."
)
COST = "Django Fundamentals costs INR 2999; its prerequisite is Python Basics."
LOOKUP = ("knowledge_lookup", {"name": "Django Fundamentals"})


def ask(env: BotEnv, text: str) -> tuple[dict[str, Any], Run]:
    """Mention the bot in a new thread and work the run to its end."""
    mention = app_mention(f"<@UBOT> {text}", user=ALICE)
    before = len(env.runs())
    env.event(mention)
    env.wait_for_runs(before + 1)
    env.settle()  # the listener has queued the run, not only created it
    env.work()
    run = env.rt.store.load(
        next(r.id for r in env.runs() if r.origin.get("thread_ts") == mention["ts"])
    )
    assert run.status.terminal, run.status
    return mention, run


def surface(env: BotEnv) -> SlackSurface:
    found = env.rt.surfaces["slack"]
    assert isinstance(found, SlackSurface)
    return found


def in_thread(env: BotEnv, mention: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in env.slack.thread(CHANNEL, mention["ts"]) if m["ts"] != mention["ts"]]


def calls_in(env: BotEnv, method: str, mention: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls of `method` that concern the thread of `mention` (by thread_ts or by ts)."""
    ours = {m["ts"] for m in in_thread(env, mention)} | {m["ts"] for m in deleted(env)}
    return [
        args
        for args in env.slack.calls(method)
        if args.get("thread_ts") == mention["ts"] or args.get("ts") in ours
    ]


def deleted(env: BotEnv) -> list[dict[str, Any]]:
    return [{"ts": args["ts"]} for args in env.slack.calls("chat.delete")]


def answer_message(env: BotEnv, mention: dict[str, Any]) -> dict[str, Any]:
    [answer] = [m for m in in_thread(env, mention) if VIEW_RUN in buttons(m.get("blocks") or [])]
    return answer


def test_the_answer_streams_into_the_thread_with_the_footer_at_the_end_and_records_the_same(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("prerequisite", [Turn(ANSWER, pace=200)])
    surface(env).answers.interval = 0.05  # appends at least every 50 ms: several in 40 tokens

    streamed_mention, streamed = ask(env, "What is the prerequisite for Django?")

    started = calls_in(env, "chat.startStream", streamed_mention)
    appended = calls_in(env, "chat.appendStream", streamed_mention)
    stopped = calls_in(env, "chat.stopStream", streamed_mention)
    assert len(started) == 1 and started[0]["recipient_user_id"] == ALICE
    assert len(appended) >= 2 and len(stopped) == 1
    message = answer_message(env, streamed_mention)
    assert message["ts"] == stopped[0]["ts"] and message["streaming"] is False
    streamed_text = "".join(c["markdown_text"] for c in [*started, *appended])
    assert ANSWER.startswith(streamed_text) and len(streamed_text) > len(ANSWER) // 2
    # once the run ended, the message became the answer as it is posted without streaming
    [final] = [c for c in env.slack.calls("chat.update") if c["ts"] == message["ts"]]
    assert env.slack.call_log.index(next(c for c in env.slack.call_log if c.args is final)) > (
        env.slack.call_log.index(next(c for c in env.slack.call_log if c.args is stopped[0]))
    )
    assert texts([b for b in message["blocks"] if b["type"] == "section"]) == ANSWER
    footer = texts([b for b in message["blocks"] if b["type"] == "context"])
    assert "1 step" in footer and "tokens" in footer and "$" in footer
    assert buttons(message["blocks"])[VIEW_RUN] == streamed.id
    assert not [
        c
        for c in calls_in(env, "chat.postMessage", streamed_mention)
        if VIEW_RUN in buttons(c.get("blocks") or [])
    ]  # the answer was not posted a second time

    env.rt.settings.stream_answers = False
    posted_mention, posted = ask(env, "What is the prerequisite for Django?")

    assert calls_in(env, "chat.startStream", posted_mention) == []
    assert ANSWER in texts(answer_message(env, posted_mention)["blocks"])
    assert streamed.status == posted.status == RunStatus.COMPLETED
    assert streamed.answer == posted.answer == ANSWER
    assert streamed.usage.model_dump(exclude={"active_seconds"}) == posted.usage.model_dump(
        exclude={"active_seconds"}
    )
    assert streamed.usage.prompt_tokens > 0 and streamed.usage.completion_tokens > 0
    assert model_server.chat_requests[0]["stream_options"] == {"include_usage": True}


def test_when_slack_refuses_streaming_the_answer_is_posted_and_then_updated(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("prerequisite", [Turn(ANSWER, pace=100)])
    env.slack.fail("chat.startStream", "not_allowed")
    surface(env).answers.update_interval = 0.05

    mention, run = ask(env, "What is the prerequisite for Django?")

    assert len(env.slack.calls("chat.startStream")) == 1  # tried once, refused
    assert env.slack.calls("chat.stopStream") == []
    message = answer_message(env, mention)
    [first] = [  # the first words, posted as plain text
        c
        for c in env.slack.calls("chat.postMessage")
        if c["thread_ts"] == mention["ts"] and not c.get("blocks")
    ]
    assert ANSWER.startswith(first["text"]) and len(first["text"]) < len(ANSWER)
    updates = [c for c in env.slack.calls("chat.update") if c["ts"] == message["ts"]]
    assert len(updates) >= 2  # text as it came, then the final message with its footer
    assert ANSWER in texts(message["blocks"]) and buttons(message["blocks"])[VIEW_RUN] == run.id

    again, _ = ask(env, "What is the prerequisite for Django, again?")
    assert len(env.slack.calls("chat.startStream")) == 1  # the workspace's refusal is remembered
    assert ANSWER in texts(answer_message(env, again)["blocks"])


def test_a_tool_call_turn_arrives_streamed_its_deltas_accumulate_and_the_tool_runs(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    preamble = "Let me look up Django Fundamentals in the course catalogue before I answer you."
    model_server.route(
        "cost",
        [
            Turn(preamble, tool_calls=[LOOKUP], pace=200),
            Turn(COST, pace=200),
        ],
    )

    mention, run = ask(env, "What does Django Fundamentals cost?")

    assert run.status == RunStatus.COMPLETED and run.answer == COST
    [call] = [c for m in run.messages for c in m.get("tool_calls") or []]
    assert call["function"]["name"] == "knowledge_lookup"
    assert call["function"]["arguments"] == '{"name": "Django Fundamentals"}'
    results = [m["content"] for m in run.messages if m.get("role") == "tool"]
    assert len(results) == 1 and "2999" in results[0]  # the tool ran on the accumulated call
    # the preamble was long enough to be shown; once the turn proved a tool call, it was taken
    # back: stopped and deleted; only the answer is left in the thread
    [taken_back] = env.slack.calls("chat.delete")
    starts = env.slack.calls("chat.startStream")
    assert len(starts) == 2 and preamble.startswith(starts[0]["markdown_text"])
    assert env.slack.message(CHANNEL, taken_back["ts"]) is None
    message = answer_message(env, mention)
    assert texts([b for b in message["blocks"] if b["type"] == "section"]) == run.answer
    assert not any(preamble[:20] in m.get("text", "") for m in in_thread(env, mention))


def test_a_streamed_answer_with_figures_no_source_has_is_flagged_when_the_stream_stops(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route(
        "cost", [Turn(tool_calls=[LOOKUP]), Turn(COST.replace("2999", "3999"), pace=200)]
    )

    mention, run = ask(env, "What does Django Fundamentals cost?")

    assert run.ungrounded == ["3999"]
    assert len(env.slack.calls("chat.startStream")) == len(env.slack.calls("chat.stopStream")) == 1
    message = answer_message(env, mention)
    shown = texts(message["blocks"])
    assert "3999" in shown and "Check these figures: 3999" in shown
    assert buttons(message["blocks"])[VIEW_RUN] == run.id


def test_a_message_left_streaming_by_a_worker_that_died_is_retired_on_the_rerun(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("prerequisite", [Turn(ANSWER, pace=200)])
    mention = app_mention("<@UBOT> What is the prerequisite for Django?", user=ALICE)
    env.event(mention)
    [run] = env.wait_for_runs(1)
    env.settle()
    # The worker that died: its own surface (another process) had streamed half an answer.
    dead = SlackSurface(WebClient(token=TOKEN, base_url=env.slack.url), env.rt)
    half = dead.answer_stream(run)
    assert half is not None
    half.text(ANSWER[:60])
    leftover_ts = next(m["ts"] for m in in_thread(env, mention) if m.get("streaming"))

    env.work()  # the rerun, in this process

    assert env.slack.message(CHANNEL, leftover_ts) is None  # stopped, then deleted
    assert not any(m.get("streaming") for m in in_thread(env, mention))
    run = env.rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert ANSWER in texts(answer_message(env, mention)["blocks"])
    assert env.rt.redis.get(surface(env).answers.keys.slack_answer(run.id)) is None


def test_a_reply_cut_off_midstream_replaces_the_streamed_text_with_the_partial_ending(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("prerequisite", [Turn(ANSWER, finish_reason="length", pace=200)])

    mention, run = ask(env, "What is the prerequisite for Django?")

    assert run.status == RunStatus.PARTIAL and run.answer is None
    [started] = env.slack.calls("chat.startStream")
    assert ANSWER.startswith(started["markdown_text"])  # shown while it was written...
    [stop] = env.slack.calls("chat.stopStream")
    assert not stop.get("blocks")
    message = answer_message(env, mention)  # ...then replaced, in place, by the ending
    assert message["ts"] == stop["ts"] and message["streaming"] is False
    shown = texts(message["blocks"])
    assert "stopped before finishing" in shown and "cut off" in shown
    assert ANSWER[:40] not in shown
    assert [m for m in in_thread(env, mention) if m.get("streaming")] == []


@pytest.mark.slow  # spawns worker processes
def test_a_worker_killed_mid_stream_leaves_no_message_streaming_and_the_rerun_answers_whole(
    redis_conn: redis.Redis, redis_url: str, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    model_server.route("prerequisite", [Turn(ANSWER, pace=25)])  # about 1.5 s of writing
    rt = make_runtime(redis_conn, model_server.url)
    with FakeSlack() as slack:
        thread_ts = slack.add_message(CHANNEL, "What is the prerequisite for Django?")
        origin = {"surface": "slack", "channel": CHANNEL, "thread_ts": thread_ts, "team": "T0001"}
        env = worker_env(
            redis_url, model_server.url, tmp_path, SLACK_BOT_TOKEN=TOKEN, SLACK_API_URL=slack.url
        )
        record = AnswerStreams(WebClient(), redis_conn, "sb:")
        first = WorkerProcess(env, tmp_path / "first.log")
        try:
            run = service.submit(
                rt, "What is the prerequisite for Django?", ALICE_REQUESTER, origin=origin
            )
            wait_until(
                lambda: redis_conn.exists(record.keys.slack_answer(run.id)),
                what="a streamed message",
            )
            [half] = [m for m in slack.thread(CHANNEL, thread_ts) if m.get("streaming")]
            first.kill9()  # mid-stream: the run is saved as of before its model call
        finally:
            first.stop()
        second = WorkerProcess(env, tmp_path / "second.log")
        try:
            wait_until(lambda: rt.store.load(run.id).status.terminal, what="the rerun to end")
        finally:
            second.stop()
        thread = slack.thread(CHANNEL, thread_ts)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED and run.answer == ANSWER
    assert ANSWER.startswith(half["text"]) and len(half["text"]) < len(ANSWER)
    assert half["ts"] not in {m["ts"] for m in thread}  # stopped and deleted by the rerun
    assert [m for m in thread if m.get("streaming")] == []
    [answer] = [m for m in thread if VIEW_RUN in buttons(m.get("blocks") or [])]
    assert ANSWER in texts(answer["blocks"])
    assert redis_conn.get(record.keys.slack_answer(run.id)) is None


def test_a_misleading_link_is_never_streamed_as_a_link(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    text = (
        "You can reset your password at [https://bank.example/login](https://evil.example/steal)"
        " or read [the guide](https://docs.example/reset) first; both take a minute."
    )
    model_server.route("reset", [Turn(text, pace=200)])
    surface(env).answers.interval = 0.01

    mention, _run = ask(env, "How do I reset my password?")

    streamed = "".join(
        c["markdown_text"]
        for c in [*env.slack.calls("chat.startStream"), *env.slack.calls("chat.appendStream")]
    )
    assert "](https://evil.example/steal)" not in streamed
    assert "https://evil.example/steal" in streamed  # shown as the address it opens
    assert "[the guide](https://docs.example/reset)" in streamed
    assert "<https://evil.example/steal>" in texts(answer_message(env, mention)["blocks"])
