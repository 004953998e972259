"""The fakes, driven by the real clients: `openai.OpenAI` and `slack_sdk.WebClient`."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from tests.fakes import slack_server
from tests.fakes.openai_server import FakeOpenAI, Fault, Script, ToolCall, Turn, embed
from tests.fakes.slack_server import FakeSlack
from tests.support.runtime import wait_until

# ---------------------------------------------------------------------------------------
# FakeOpenAI
# ---------------------------------------------------------------------------------------


@pytest.fixture
def openai_fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def client_for(fake: FakeOpenAI, max_retries: int = 0, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=fake.url, api_key="test", max_retries=max_retries, timeout=timeout
    )


def ask(client: openai.OpenAI, text: str, *history: dict[str, Any], **kwargs: Any) -> Any:
    messages: list[Any] = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": text},
        *history,
    ]
    return client.chat.completions.create(model="gpt-test", messages=messages, **kwargs)


def test_text_turn_has_the_real_response_shape(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script(["Hello there."])

    response = ask(client_for(openai_fake), "hi")

    choice = response.choices[0]
    assert choice.message.content == "Hello there."
    assert choice.message.role == "assistant"
    assert choice.message.tool_calls is None
    assert choice.message.refusal is None
    assert choice.finish_reason == "stop"
    assert response.model == "gpt-test"
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.usage is not None
    assert response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )
    [body] = openai_fake.chat_requests
    assert body["messages"][1] == {"role": "user", "content": "hi"}
    assert openai_fake.requests[0].headers["authorization"] == "Bearer test"


def test_tool_calls_then_answer_is_chosen_by_assistant_count(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script(
        [
            Turn(
                tool_calls=[
                    ("calculate", {"expression": "2+2"}),
                    ToolCall("knowledge_lookup", '{"name": "Python'),  # invalid JSON
                ],
                usage=(120, 30),
            ),
            Turn("It is 4."),
        ]
    )
    client = client_for(openai_fake)

    first = ask(client, "what is 2+2?")

    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.tool_calls is not None
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls]
    assert calls[0][1:] == ("calculate", '{"expression": "2+2"}')
    assert calls[1][1:] == ("knowledge_lookup", '{"name": "Python')
    assert calls[0][0].startswith("call_0_0_") and calls[1][0].startswith("call_0_1_")
    assert first.usage is not None and first.usage.prompt_tokens == 120
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[1][2])

    history = [
        {"role": "assistant", "content": None, "tool_calls": message.model_dump()["tool_calls"]},
        {"role": "tool", "tool_call_id": calls[0][0], "content": "4"},
        {"role": "tool", "tool_call_id": calls[1][0], "content": "Error: invalid JSON"},
    ]
    second = ask(client, "what is 2+2?", *history)

    assert second.choices[0].message.content == "It is 4."
    assert second.choices[0].finish_reason == "stop"
    assert len(openai_fake.chat_requests) == 2


def test_replies_are_stateless_so_a_replayed_request_gets_the_same_turn(
    openai_fake: FakeOpenAI,
) -> None:
    openai_fake.script = Script([Turn(tool_calls=[("calculate", {"expression": "1"})])])
    client = client_for(openai_fake)

    first = ask(client, "same question")
    again = ask(client, "same question")
    other = ask(client, "another question")

    def first_id(response: Any) -> str:
        return str(response.choices[0].message.tool_calls[0].id)

    assert first_id(first) == first_id(again)
    assert first_id(first) != first_id(other)


def test_length_content_filter_and_refusal(openai_fake: FakeOpenAI) -> None:
    openai_fake.route(
        "truncated", [Turn(tool_calls=[("calculate", '{"expr')], finish_reason="length")]
    )
    openai_fake.route("filtered", [Turn("", finish_reason="content_filter")])
    openai_fake.route("refuse", [Turn(refusal="I can't help with that.")])
    client = client_for(openai_fake)

    truncated = ask(client, "truncated please").choices[0]
    filtered = ask(client, "filtered please").choices[0]
    refused = ask(client, "refuse please").choices[0]

    assert truncated.finish_reason == "length"
    assert truncated.message.tool_calls is not None
    assert truncated.message.tool_calls[0].function.arguments == '{"expr'
    assert filtered.finish_reason == "content_filter"
    assert refused.finish_reason == "stop"
    assert refused.message.refusal == "I can't help with that."
    assert refused.message.content is None


def test_429_then_success_is_retried_by_the_client_honouring_retry_after_ms(
    openai_fake: FakeOpenAI,
) -> None:
    openai_fake.script = Script(["done"], faults={0: [Fault.rate_limit(retry_after=0.05)]})
    client = client_for(openai_fake, max_retries=2)
    started = time.monotonic()

    response = ask(client, "rate limited")

    elapsed = time.monotonic() - started
    assert response.choices[0].message.content == "done"
    assert len(openai_fake.chat_requests) == 2
    # Without retry-after the client backs off 0.375-0.5 s; quicker means it used retry-after-ms.
    assert elapsed < 0.3


def test_429_error_body_and_headers(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script(["ok"], faults={0: Fault.rate_limit(retry_after=2)})

    with pytest.raises(openai.RateLimitError) as caught:
        ask(client_for(openai_fake, max_retries=0), "rate limited")

    error = caught.value
    assert error.status_code == 429
    assert error.response.headers["retry-after"] == "2"
    assert error.response.headers["retry-after-ms"] == "2000"
    assert isinstance(error.body, dict)
    assert error.body["code"] == "rate_limit_exceeded"
    assert error.body["type"] == "requests"


def test_500_three_times_exhausts_the_client_then_the_next_call_succeeds(
    openai_fake: FakeOpenAI,
) -> None:
    failing = Fault.server_error(500, retry_after=0.01)
    openai_fake.script = Script(["recovered"], faults={0: [failing, failing, failing]})
    client = client_for(openai_fake, max_retries=2)

    with pytest.raises(openai.InternalServerError) as caught:
        ask(client, "flaky")
    assert caught.value.status_code == 500
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "server_error"
    assert len(openai_fake.chat_requests) == 3

    assert ask(client, "flaky").choices[0].message.content == "recovered"


def test_dropped_connection_is_a_connection_error(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script(["after the drop"], faults={0: [Fault.dropped()]})
    client = client_for(openai_fake, max_retries=0)

    with pytest.raises(openai.APIConnectionError):
        ask(client, "drop me")

    assert ask(client, "drop me").choices[0].message.content == "after the drop"


def test_slow_fault_trips_the_client_timeout_once(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script(["in time"], faults={0: [Fault.slow(5)]})
    client = client_for(openai_fake, max_retries=0, timeout=0.2)

    with pytest.raises(openai.APITimeoutError):
        ask(client, "slow")

    assert ask(client, "slow").choices[0].message.content == "in time"


def test_stop_interrupts_a_delayed_answer() -> None:
    fake = FakeOpenAI([Turn("never", delay=30)]).start()
    errors: list[Exception] = []

    def call() -> None:
        try:
            ask(client_for(fake, timeout=30), "wait")
        except openai.APIConnectionError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    fake.wait_for(lambda: fake.chat_requests)
    started = time.monotonic()
    fake.stop()
    caller.join(timeout=5)

    assert time.monotonic() - started < 2
    assert not caller.is_alive()
    assert len(errors) == 1


def test_routes_serve_concurrent_conversations(openai_fake: FakeOpenAI) -> None:
    openai_fake.route({"alpha": ["from alpha"], "beta": Script(["from beta"])})
    openai_fake.route(lambda body: Turn("from function") if body.get("user") == "u9" else None)
    openai_fake.script = ["default"]
    client = client_for(openai_fake)
    answers: dict[str, str] = {}

    def run(text: str, **kwargs: Any) -> None:
        answers[text] = str(ask(client, text, **kwargs).choices[0].message.content)

    threads = [
        threading.Thread(target=run, args=(f"{name} #{n}",))
        for name in ("alpha", "beta", "gamma")
        for n in range(3)
    ]
    threads.append(threading.Thread(target=run, args=("custom",), kwargs={"user": "u9"}))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {k: v for k, v in answers.items() if k.startswith("alpha")} == {
        f"alpha #{n}": "from alpha" for n in range(3)
    }
    assert answers["beta #2"] == "from beta"
    assert answers["gamma #0"] == "default"
    assert answers["custom"] == "from function"


def test_the_fake_counts_the_most_chat_requests_it_answered_at_once(
    openai_fake: FakeOpenAI,
) -> None:
    """What bench/bench_latency.py reports as runs in flight: the model's own count."""
    openai_fake.script = [Turn("slow", delay=2.0)]
    client = client_for(openai_fake)
    threads = [threading.Thread(target=ask, args=(client, f"q{n}")) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # the clients have their replies; the server may not have closed the last request yet
    wait_until(lambda: openai_fake.chats_open == 0, what="the fake to close its requests")
    assert openai_fake.take_peak_chats() == 3
    assert openai_fake.take_peak_chats() == 0  # none open now: the count starts again
    openai_fake.script = ["quick"]
    ask(client, "one")
    ask(client, "two")
    assert openai_fake.take_peak_chats() == 1


def test_an_exhausted_script_fails_without_retries_and_is_reported(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = Script([])

    with pytest.raises(openai.InternalServerError):
        ask(client_for(openai_fake, max_retries=2), "nothing scripted")

    assert len(openai_fake.chat_requests) == 1  # x-should-retry: false
    assert "script exhausted" in openai_fake.script_errors[0]


def test_requests_the_real_api_rejects_get_a_400(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = ["unreachable"]
    client = client_for(openai_fake)
    unanswered = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    loose_schema = {
        "type": "function",
        "function": {
            "name": "f",
            "strict": True,
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }

    with pytest.raises(openai.BadRequestError, match="did not have response messages: call_1"):
        ask(client, "q", unanswered)
    with pytest.raises(openai.BadRequestError, match="must be a response to a preceeding"):
        ask(client, "q", {"role": "tool", "tool_call_id": "call_9", "content": "x"})
    with pytest.raises(openai.BadRequestError, match="'additionalProperties' is required"):
        ask(client, "q", tools=[loose_schema])
    assert openai_fake.script_errors == []


def test_streaming_reassembles_to_the_same_reply(openai_fake: FakeOpenAI) -> None:
    openai_fake.script = [Turn("Streaming works fine.", tool_calls=[("calculate", {"e": "1"})])]
    stream = ask(
        client_for(openai_fake), "stream", stream=True, stream_options={"include_usage": True}
    )

    text, arguments, finish, usage = "", "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                arguments += call.function.arguments if call.function else ""
            finish = choice.finish_reason or finish

    assert text == "Streaming works fine."
    assert json.loads(arguments) == {"e": "1"}
    assert finish == "tool_calls"
    assert usage is not None and usage.total_tokens > 0


def test_embeddings_are_deterministic_normalized_and_similar_for_similar_text(
    openai_fake: FakeOpenAI,
) -> None:
    client = client_for(openai_fake)
    texts = ["create a support ticket", "create support tickets", "course fee for Django"]

    default = client.embeddings.create(model="embed-test", input=texts)  # base64 on the wire
    as_float = client.embeddings.create(model="embed-test", input=texts, encoding_format="float")

    vectors = [item.embedding for item in default.data]
    assert all(len(vector) == 64 for vector in vectors)
    assert all(math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5) for vector in vectors)
    assert [item.embedding for item in as_float.data] == [embed(text) for text in texts]
    assert openai_fake.embedding_requests[0]["encoding_format"] == "base64"

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[1]) > 0.8
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3


def test_a_wrong_api_key_is_refused() -> None:
    with FakeOpenAI(["hello"], api_key="right") as fake:
        right = openai.OpenAI(base_url=fake.url, api_key="right")
        assert ask(right, "hi").choices[0].message.content == "hello"

        wrong = openai.OpenAI(base_url=fake.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            ask(wrong, "hi")


# ---------------------------------------------------------------------------------------
# FakeSlack
# ---------------------------------------------------------------------------------------


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(
        usergroups=[{"id": "S0001", "handle": "support-team", "users": ["U0ADMIN", "U0USER"]}],
    ) as fake:
        yield fake


@pytest.fixture
def web(slack: FakeSlack) -> WebClient:
    return WebClient(token="xoxb-test", base_url=slack.url)


def slack_error(call: Any) -> SlackApiError:
    with pytest.raises(SlackApiError) as caught:
        call()
    return caught.value


def test_auth(slack: FakeSlack, web: WebClient) -> None:
    answer = web.auth_test()

    assert (answer["user_id"], answer["team_id"], answer["bot_id"]) == ("UBOT", "T0001", "B0001")
    assert slack_error(WebClient(base_url=slack.url).auth_test).response["error"] == "not_authed"
    bogus = WebClient(token="bogus", base_url=slack.url)
    assert slack_error(bogus.auth_test).response["error"] == "invalid_auth"
    assert slack_error(lambda: web.api_call("nope.nothing")).response["error"] == "unknown_method"
    assert [call.method for call in slack.call_log] == [
        "auth.test",
        "auth.test",
        "auth.test",
        "nope.nothing",
    ]


def test_thread_post_and_update(slack: FakeSlack, web: WebClient) -> None:
    parent = slack.add_message("C1", "<@UBOT> help me", user="U0USER")

    posted = web.chat_postMessage(channel="C1", thread_ts=parent, text="Working on it…")
    web.chat_update(channel="C1", ts=posted["ts"], text="Done: 4")
    web.chat_postMessage(channel="C1", text="top level")

    assert posted["message"]["user"] == "UBOT"
    thread = slack.thread("C1", parent)
    assert [m["text"] for m in thread] == ["<@UBOT> help me", "Done: 4"]
    assert thread[0]["reply_count"] == 1
    assert thread[1]["thread_ts"] == parent
    assert [m["text"] for m in slack.messages("C1")] == [m["text"] for m in thread] + ["top level"]
    assert slack.last("chat.update")["text"] == "Done: 4"
    assert slack.calls("chat.postMessage")[0]["thread_ts"] == parent

    missing = slack_error(lambda: web.chat_update(channel="C1", ts="1.000001", text="x"))
    assert missing.response["error"] == "message_not_found"
    with pytest.warns(UserWarning, match="text"):  # slack_sdk warns before sending
        no_text = slack_error(lambda: web.chat_postMessage(channel="C1"))
    assert no_text.response["error"] == "no_text"


def test_form_encoded_calls_are_parsed(slack: FakeSlack, web: WebClient) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}]

    posted = web.api_call(
        "chat.postMessage", params={"channel": "C2", "text": "hi", "blocks": json.dumps(blocks)}
    )
    web.chat_delete(channel="C2", ts=posted["ts"])  # slack_sdk sends this one form-encoded

    assert slack.calls("chat.postMessage")[0]["blocks"] == blocks
    assert slack.last("chat.delete") == {"channel": "C2", "ts": posted["ts"]}
    assert slack.messages("C2") == []


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def button(**overrides: Any) -> dict[str, Any]:
    element = {
        "type": "button",
        "action_id": "approve",
        "value": "v",
        "text": {"type": "plain_text", "text": "Approve"},
    }
    return {"type": "actions", "elements": [{**element, **overrides}]}


@pytest.mark.parametrize(
    ("blocks", "error"),
    [
        ([section("x")] * 51, "invalid_blocks"),
        ([section("x" * 3001)], "invalid_blocks"),
        ([button(value="v" * 2001)], "invalid_blocks"),
        ([button(action_id="a" * 256)], "invalid_blocks"),
        ([button(text={"type": "plain_text", "text": "t" * 76})], "invalid_blocks"),
        ([section("x" * 2900)] * 5, "msg_blocks_too_long"),
    ],
    ids=["51-blocks", "section-3001", "value-2001", "action-id-256", "button-76", "total-14500"],
)
def test_block_limits(web: WebClient, blocks: list[dict[str, Any]], error: str) -> None:
    for method in ("post", "update"):
        if method == "post":
            failure = slack_error(
                lambda: web.chat_postMessage(channel="C3", text="t", blocks=blocks)
            )
        else:
            ts = web.chat_postMessage(channel="C3", text="fine")["ts"]
            failure = slack_error(
                lambda ts=ts: web.chat_update(channel="C3", ts=ts, text="t", blocks=blocks)
            )
        assert failure.response["error"] == error
        if error == "invalid_blocks":
            assert failure.response["response_metadata"]["messages"][0].startswith("[ERROR]")


def test_limits_at_the_edge_are_accepted_and_long_text_is_truncated(
    slack: FakeSlack, web: WebClient
) -> None:
    blocks = [section("x" * 3000), button(value="v" * 2000, action_id="a" * 255)]

    posted = web.chat_postMessage(channel="C4", text="y" * 45_000, blocks=blocks)

    assert len(posted["message"]["text"]) == 40_000
    assert len(slack.messages("C4")[0]["text"]) == 40_000


def test_rate_limit_and_fail_knobs(slack: FakeSlack, web: WebClient) -> None:
    slack.rate_limit("chat.postMessage", times=1, retry_after=7)
    limited = slack_error(lambda: web.chat_postMessage(channel="C5", text="a"))
    assert limited.response.status_code == 429
    assert limited.response["error"] == "ratelimited"
    assert limited.response.headers["Retry-After"] == "7"
    assert web.chat_postMessage(channel="C5", text="b")["ok"]

    slack.fail("chat.postMessage", "channel_not_found")
    failed = slack_error(lambda: web.chat_postMessage(channel="C5", text="c"))
    assert failed.response["error"] == "channel_not_found"

    slack.fail("chat.getPermalink", "missing_scope", times=5)
    slack.reset()
    assert slack.call_log == [] and slack.messages("C5") == []
    missing = slack_error(lambda: web.chat_getPermalink(channel="C5", message_ts="1.2"))
    assert missing.response["error"] == "message_not_found"  # the failures are forgotten


def test_a_crashing_method_answers_500_fatal_error(
    monkeypatch: pytest.MonkeyPatch, web: WebClient
) -> None:
    def broken(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
        raise KeyError("bug in the fake")

    monkeypatch.setitem(slack_server._METHODS, "bots.info", broken)

    failure = slack_error(lambda: web.bots_info(bot="B0001"))
    assert (failure.response.status_code, failure.response["error"]) == (500, "fatal_error")
    assert web.auth_test()["ok"]  # the server keeps serving


def test_the_sdk_retry_handler_honours_retry_after(slack: FakeSlack) -> None:
    slack.rate_limit("chat.postMessage", times=1, retry_after=0)
    client = WebClient(
        token="xoxb-test",
        base_url=slack.url,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=1)],
    )

    assert client.chat_postMessage(channel="C6", text="eventually")["ok"]
    assert len(slack.calls("chat.postMessage")) == 2


def test_wait_for_call_sees_calls_from_other_threads(slack: FakeSlack, web: WebClient) -> None:
    poster = threading.Timer(0.05, lambda: web.chat_postMessage(channel="C7", text="later"))
    poster.start()

    args = slack.wait_for_call("chat.postMessage", lambda a: a["text"] == "later")
    poster.join()

    assert args["channel"] == "C7"
    assert slack.wait_for_message("C7")["text"] == "later"
    with pytest.raises(TimeoutError, match=r"chat\.postMessage"):
        slack.wait_for_call("chat.update", timeout=0.05)


def test_views(slack: FakeSlack, web: WebClient) -> None:
    modal = {
        "type": "modal",
        "callback_id": "approve_with_changes",
        "title": {"type": "plain_text", "text": "Approve"},
        "blocks": [section("Check the arguments")],
    }

    no_trigger = slack_error(lambda: web.views_open(trigger_id="", view=modal))
    opened = web.views_open(trigger_id="123.456.abc", view=modal)["view"]
    updated = web.views_update(view_id=opened["id"], hash=opened["hash"], view=modal)["view"]
    stale = slack_error(lambda: web.views_update(view_id=opened["id"], hash="old", view=modal))
    pushed = web.views_push(trigger_id="123.456.def", view=modal)["view"]
    long_title = {**modal, "title": {"type": "plain_text", "text": "t" * 25}}

    assert no_trigger.response["error"] == "invalid_arguments"
    assert opened["callback_id"] == "approve_with_changes"
    assert updated["id"] == opened["id"] and updated["hash"] != opened["hash"]
    assert stale.response["error"] == "hash_conflict"
    assert pushed["id"] != opened["id"]
    assert (
        slack_error(lambda: web.views_open(trigger_id="t", view=long_title)).response["error"]
        == "invalid_arguments"
    )


def test_views_publish_limits(slack: FakeSlack, web: WebClient) -> None:
    home = {"type": "home", "blocks": [section("Your runs")]}
    too_many = {"type": "home", "blocks": [section("x")] * 101}
    too_big = {"type": "home", "blocks": [section("x" * 2900)] * 90}

    stored = web.views_publish(user_id="U0USER", view=home)["view"]
    again = web.views_publish(user_id="U0USER", view=home, hash=stored["hash"])["view"]
    stale = slack_error(lambda: web.views_publish(user_id="U0USER", view=home, hash="old"))

    assert stored["blocks"] == home["blocks"] and again["id"] == stored["id"]
    assert stale.response["error"] == "hash_conflict"
    for view in (too_many, too_big):
        failure = slack_error(lambda v=view: web.views_publish(user_id="U0USER", view=v))
        assert failure.response["error"] == "invalid_arguments"


def test_streaming_messages(slack: FakeSlack, web: WebClient) -> None:
    parent = slack.add_message("D1", "question")

    stream = web.chat_stream(channel="D1", thread_ts=parent, buffer_size=5)
    stream.append(markdown_text="Hello, ")
    stream.append(markdown_text="world")
    stream.stop(markdown_text="!")

    [reply] = [m for m in slack.thread("D1", parent) if m["ts"] != parent]
    assert reply["text"] == "Hello, world!"
    assert reply["streaming"] is False
    assert slack.call_log[0].method == "chat.startStream"


def test_assistant_threads(slack: FakeSlack, web: WebClient) -> None:
    web.assistant_threads_setStatus(channel_id="D1", thread_ts="1.1", status="is thinking…")
    web.assistant_threads_setTitle(channel_id="D1", thread_ts="1.1", title="Refund")
    prompts = [{"title": "Fees", "message": "What does Django cost?"}]
    web.assistant_threads_setSuggestedPrompts(channel_id="D1", thread_ts="1.1", prompts=prompts)

    state = slack.assistant_thread("D1", "1.1")
    assert (state["status"], state["title"], state["prompts"]) == (
        "is thinking…",
        "Refund",
        prompts,
    )
    too_many = slack_error(
        lambda: web.assistant_threads_setSuggestedPrompts(
            channel_id="D1", thread_ts="1.1", prompts=prompts * 5
        )
    )
    assert too_many.response["error"] == "invalid_arguments"


def test_usergroups_and_ephemeral(slack: FakeSlack, web: WebClient) -> None:
    slack.add_message("C8", "hello")

    groups = web.usergroups_list(include_users=True)["usergroups"]
    members = web.usergroups_users_list(usergroup="S0001")["users"]
    ephemeral = web.chat_postEphemeral(channel="C8", user="U0USER", text="only you")

    assert groups[0]["handle"] == "support-team" and groups[0]["users"] == members
    assert members == ["U0ADMIN", "U0USER"]
    assert (
        slack_error(lambda: web.usergroups_users_list(usergroup="S9")).response["error"]
        == "no_such_subteam"
    )
    assert ephemeral["message_ts"]
    assert slack.last("chat.postEphemeral")["text"] == "only you"
    assert [m["text"] for m in slack.messages("C8")] == ["hello"]  # only its user sees it
