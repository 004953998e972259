"""Model calls as a local or slow model meets them (issue 23): every request bounded, one
deadline per step whatever the server does, every attempt visible while the step runs, and
errors that say what happened. Real Redis, RQ, the real openai client against FakeOpenAI."""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.render.blocks import answer_messages
from switchboard.render import event_line
from switchboard.settings import Config
from tests.fakes.openai_server import FakeOpenAI, Fault, Recorded, Script, Turn
from tests.support.redis_server import free_port
from tests.support.runtime import (
    ALICE,
    KeptText,
    make_runtime,
    wait_for_run,
    wait_until,
    work,
)
from tools.declare import make_tool
from worker import metrics, service
from worker.library import Selector, TaskLibrary
from worker.model import POOL_THREADS, ModelClient, ModelError, Sampling, Spent, pools_for
from worker.model_base import ToolSpecs, encode_body
from worker.run import Budgets, EndReason, Run, RunStatus
from worker.surface import SilentSurface

FEE = "What is the fee for Django Fundamentals and its prerequisite?"
PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake is reached directly, whatever proxy the machine's environment names (one
    named sends completions through the SDK's client: tests below say where it matters)."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


FEE_TURNS = [
    Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})], usage=(900, 40)),
    Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})], usage=(1000, 40)),
    Turn("Django Fundamentals costs 2999 and Python Basics 1999.", usage=(1100, 30)),
]


class Watching(SilentSurface):
    """A surface that keeps what the runtime shows it: status lines and streamed text."""

    def __init__(self, stream: bool = True) -> None:
        self.stream = stream
        self.statuses: list[str] = []
        self.streamed: list[str] = []

    def progress(self, run: Run, text: str) -> None:
        self.statuses.append(text)

    def answer_stream(self, run: Run) -> Watching | None:
        return self if self.stream else None

    def text(self, delta: str) -> None:
        self.streamed.append(delta)

    def reset(self) -> None:
        self.streamed.clear()


def bound_of(body: dict[str, Any]) -> int:
    return int(body.get("max_tokens") or body["max_completion_tokens"])


def test_every_model_request_carries_a_bounded_max_tokens_within_the_runs_token_budget(
    redis_conn, model_server: FakeOpenAI, tickets_db
) -> None:
    model_server.route(FEE, FEE_TURNS)
    # 2,048 a reply by default; the budget leaves 3,000 - 940 = 2,060, then 1,020
    rt = make_runtime(redis_conn, model_server.url, budgets=Budgets(max_tokens=3000))
    run = service.submit(rt, FEE, ALICE)
    work(rt)
    ended = rt.store.load(run.id)
    bodies = [b for b in model_server.chat_requests if FEE in str(b["messages"])]
    assert [bound_of(b) for b in bodies] == [2048, 2048, 1020]
    assert all("max_tokens" in b and "max_completion_tokens" not in b for b in bodies)
    # nothing the operator did not configure: no temperature, tool_choice, parallel_tool_calls
    assert not any({"temperature", "tool_choice", "parallel_tool_calls"} & set(b) for b in bodies)
    assert ended.usage.tokens == 3110 and ended.status == RunStatus.COMPLETED


def test_a_profiles_max_tokens_bounds_its_runs_replies(
    redis_conn, model_server: FakeOpenAI, tickets_db, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("profiles:\n  dm:\n    max_tokens: 300\n", encoding="utf-8")
    model_server.route("terse", ["Short."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy)
    run = service.submit(rt, "a terse question", ALICE, profile="dm")
    work(rt)
    assert rt.store.load(run.id).profile.max_tokens == 300  # type: ignore[union-attr]
    assert bound_of(model_server.last_chat_request) == 300


@pytest.mark.parametrize(
    ("value", "problem"),
    [("0", "from 1 to 1,000,000"), ("lots", "whole number"), ("1.5", "whole number")],
)
def test_a_profiles_max_tokens_must_be_a_whole_number_and_the_error_names_its_line(
    tmp_path: Path, value: str, problem: str
) -> None:
    from tools.exceptions import PolicyError
    from tools.policy import Policy
    from tools.registry import registry

    path = tmp_path / "policy.yaml"
    path.write_text(f"profiles:\n  dm:\n    max_tokens: {value}\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=f"line 3.*max_tokens.*{problem}"):
        Policy.load(path, registry)


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.integers(-10, 2_000_000).map(str),
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
        st.sampled_from(
            [
                "0x10",
                "1_000",
                "1e3",
                "+5",
                "[1]",
                "{a: 1}",
                "~",
                "''",
                "true",
                "!!int ²",
                "!!int 12",
            ]
        ),
    )
)
def test_any_max_tokens_value_reads_as_a_bound_in_range_or_as_an_error_on_its_line(
    value: str,
) -> None:
    from tools.exceptions import PolicyError
    from tools.policy import Policy
    from tools.registry import registry

    text = "profiles:\n  dm:\n    max_tokens: " + value + "\n"  # as the operator typed it
    try:
        policy = Policy.parse(text, registry)
    except PolicyError as exc:  # a bad value names its line; so does a YAML error
        assert "line" in str(exc)
        return
    bound = policy.profiles["dm"].max_tokens
    assert bound is None or 1 <= bound <= 1_000_000  # None: a YAML null, `max_tokens:` unset
    if value.strip().isdigit():
        assert bound == int(value)


def test_the_knobs_are_sent_only_when_configured_and_the_tool_ones_only_with_tools(
    model_server: FakeOpenAI,
) -> None:
    model_server.script = ["fine"] * 2
    client = ModelClient(model="gpt-fake", api_key="k", base_url=model_server.url)
    client.sampling = Sampling(
        tokens_param="max_completion_tokens",
        temperature=0.2,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    question = [{"role": "user", "content": "q"}]
    client.complete(question, [tool], 5.0, max_tokens=64)
    client.complete(question, [], 5.0, max_tokens=64)
    with_tools, without = model_server.chat_requests
    assert with_tools["max_completion_tokens"] == 64 and "max_tokens" not in with_tools
    assert (with_tools["tool_choice"], with_tools["parallel_tool_calls"]) == ("required", False)
    assert with_tools["temperature"] == without["temperature"] == 0.2
    assert "tool_choice" not in without and "parallel_tool_calls" not in without


def test_concurrent_callers_share_connection_pools_in_groups_each_keeping_its_own(
    model_server: FakeOpenAI,
) -> None:
    # One pool for every slot serialized 1,000 slots on its lock (issue 28): the callers are
    # spread over pools_for(n) pools, at most POOL_THREADS each, and keep theirs; a pooled
    # client is the configured one (key, server, timeouts) but for its connections.
    callers = 40
    model_server.script = ["fine"] * callers
    client = ModelClient(
        model="gpt-fake", api_key="sk-pooled", base_url=model_server.url, pools=pools_for(callers)
    )
    start = threading.Barrier(callers)
    used: dict[int, int] = {}
    failures: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            start.wait(timeout=10)
            pool = client._pooled()
            turn = client.complete([{"role": "user", "content": "q"}], [], 5.0, max_tokens=8)
            assert turn.content == "fine" and client._pooled() == pool
            used[i] = pool
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures and len(used) == callers
    per_pool = Counter(used.values())
    assert len(per_pool) == pools_for(callers) == 3
    directs = [client._clients.direct(pool) for pool in range(3)]  # a pool of connections each
    assert len({id(direct.pool) for direct in directs if direct is not None}) == 3
    assert max(per_pool.values()) <= POOL_THREADS
    assert {r.headers.get("authorization") for r in model_server.requests} == {"Bearer sk-pooled"}
    assert pools_for(1) == pools_for(POOL_THREADS) == 1 and pools_for(POOL_THREADS + 1) == 2


@pytest.mark.parametrize(
    ("base_url", "param"),
    [
        ("", "max_completion_tokens"),  # OpenAI itself
        ("https://api.openai.com/v1", "max_completion_tokens"),
        ("http://127.0.0.1:8080/v1", "max_tokens"),  # llama.cpp, vLLM, Ollama, a proxy
    ],
)
def test_the_bound_is_named_as_the_server_expects_unless_the_operator_says(
    base_url: str, param: str
) -> None:
    assert Config(OPENAI_BASE_URL=base_url).tokens_param == param
    named = Config(OPENAI_BASE_URL=base_url, SWITCHBOARD_MODEL_TOKENS_PARAM="max_tokens")
    assert named.tokens_param == "max_tokens"


def never_stops(pace: float = 200.0) -> Turn:
    """A model that writes and writes: far more text than its step has time for."""
    return Turn(text="and then the course goes on " * 300, pace=pace)  # 2,100 tokens


def attempts_failed(tokens: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "switchboard_model_attempts_failed_total", {"tokens": tokens}
    )
    return value or 0.0


def test_a_model_that_never_stops_ends_its_step_at_the_deadline_with_its_tokens_counted(
    redis_conn, model_server: FakeOpenAI, tickets_db
) -> None:
    model_server.route("never stops", [never_stops()])
    surface = Watching()
    rt = make_runtime(
        redis_conn, model_server.url, model_timeout=1.5, surfaces={"watching": surface}
    )
    estimated = attempts_failed("estimated")
    started = time.monotonic()
    run = service.submit(rt, "a model that never stops", ALICE, origin={"surface": "watching"})
    work(rt)
    took = time.monotonic() - started
    ended = rt.store.load(run.id)
    assert (ended.status, ended.reason) == (RunStatus.PARTIAL, EndReason.MODEL_ERROR)
    assert ended.detail == "the model did not finish within 1.5 s (1 attempt)"
    assert took < 1.5 + 2.0, f"{took:.1f} s for a 1.5 s step"
    [failed] = [e for e in rt.events.read(run.id) if e.kind == "model_attempt_failed"]
    assert failed.data["tokens"] == "estimated"
    # at most ~200 tokens a second for 1.5 s (fewer on a busy machine); all of it counted
    written = failed.data["completion_tokens"]
    assert 0 < written <= 1.5 * 200 * 1.2, written
    assert ended.usage.completion_tokens == written and ended.usage.prompt_tokens > 0
    assert ended.usage.steps == 1
    assert attempts_failed("estimated") == estimated + 1
    # the estimate counts what was written, 4 characters a token: what the surface showed
    assert 0 < len("".join(surface.streamed)) <= written * 4


def test_a_whole_answer_that_never_comes_is_recorded_as_unknown_not_as_nothing(
    redis_conn, model_server: FakeOpenAI, tickets_db
) -> None:
    model_server.route("never stops", [never_stops(pace=100.0)])
    rt = make_runtime(redis_conn, model_server.url, model_timeout=1.0)  # silent: not streamed
    unknown = attempts_failed("unknown")
    run = service.submit(rt, "a model that never stops", ALICE)
    work(rt)
    ended = rt.store.load(run.id)
    assert ended.detail.startswith("the model did not finish within 1 s (")
    failed = [e.data for e in rt.events.read(run.id) if e.kind == "model_attempt_failed"]
    assert failed[0]["tokens"] == "unknown" and ended.usage.tokens == 0
    assert attempts_failed("unknown") >= unknown + 1
    lines = [line for e in rt.events.read(run.id) for line in event_line(e, ended.created_at)]
    assert any("tokens unknown (the server never said)" in line for line in lines)


def test_a_timed_out_attempt_and_its_retries_are_visible_while_the_step_still_runs(
    redis_conn, model_server: FakeOpenAI, tickets_db
) -> None:
    """Two attempts find the server silent (given up after the 0.5 s read timeout); the third
    is answered. The demonstrations selected, each start and each failure are in the event
    log, and the retry on the status, before the step has ended."""
    model_server.route(
        "silent twice", Script(["It is 5."], faults={0: [Fault.slow(3.0), Fault.slow(3.0)]})
    )
    surface = Watching(stream=False)
    rt = make_runtime(
        redis_conn,
        model_server.url,
        model_timeout=20.0,
        model_retries=2,
        surfaces={"watching": surface},
    )
    assert isinstance(rt.model, ModelClient)
    rt.model.read_timeout, rt.model.watch_every = 0.5, 0.1
    rt.demos = Selector(TaskLibrary(redis_conn), k=2)
    run = service.submit(rt, "silent twice, then 2 + 3", ALICE, origin={"surface": "watching"})
    worker = threading.Thread(target=work, args=(rt,), daemon=True)
    worker.start()

    def seen() -> list[tuple[str, Any]] | None:
        kinds = [
            (e.kind, e.data.get("attempt"))
            for e in rt.events.read(run.id)
            if e.kind.startswith("model_") or e.kind == "demos_selected"
        ]
        return kinds if ("model_call_started", 2) in kinds else None

    during = wait_until(seen, 15.0, "the second attempt to be recorded")
    assert rt.store.load(run.id).status == RunStatus.RUNNING  # the step has not ended
    assert during[:4] == [
        ("demos_selected", None),  # written when the first attempt starts, not at the end
        ("model_call_started", 1),
        ("model_attempt_failed", 1),
        ("model_call_started", 2),
    ]
    failed = next(e for e in rt.events.read(run.id) if e.kind == "model_attempt_failed")
    assert failed.data["error"] == "the model sent nothing for 0.5 s"
    wait_until(
        lambda: any("attempt 2 of 3" in s for s in surface.statuses),
        15.0,
        "the status to name the retry",
    )
    ended = wait_for_run(rt, run.id, timeout=20.0)
    worker.join(10.0)
    assert ended.status == RunStatus.COMPLETED and ended.answer == "It is 5."
    kinds = [e.kind for e in rt.events.read(run.id) if e.kind.startswith("model_")]
    assert kinds.count("model_call_started") == 3 and kinds.count("model_attempt_failed") == 2
    assert any(s.startswith("Waiting for the model (step 1 of 8): ") for s in surface.statuses)


def test_retries_follow_the_servers_word_and_never_start_after_the_deadline(
    model_server: FakeOpenAI,
) -> None:
    question = [{"role": "user", "content": "no script for this"}]  # x-should-retry: false
    client = ModelClient(model="gpt-fake", api_key="k", base_url=model_server.url)
    with pytest.raises(ModelError, match=r"HTTP 500: .* \(1 attempt\)$"):
        client.complete(question, [], 5.0)
    assert len(model_server.chat_requests) == 1
    # a 429 whose Retry-After is past the step's deadline is not waited for
    model_server.route("busy", Script(["late"], faults={0: [Fault.rate_limit(retry_after=30)]}))
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"HTTP 429: .* \(1 attempt\)$") as caught:
        client.complete([{"role": "user", "content": "busy"}], [], 2.0)
    assert time.monotonic() - started < 1.5 and caught.value.kind == "rate_limited"


def test_a_connection_error_names_the_servers_url_and_never_the_key() -> None:
    port = free_port()  # nothing listens there
    client = ModelClient(
        model="m", api_key="sk-secret-key", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1
    )
    with pytest.raises(ModelError) as caught:
        client.complete([{"role": "user", "content": "q"}], [], 5.0)
    detail = caught.value.detail
    assert detail.startswith(f"could not reach the model server at http://127.0.0.1:{port}/v1 (")
    assert detail.endswith("(2 attempts)") and "sk-secret" not in detail
    assert caught.value.kind == "unreachable"


def test_a_cut_off_reply_says_so_once_and_says_where(
    redis_conn, model_server: FakeOpenAI, tickets_db
) -> None:
    model_server.route("cut", [Turn("The answer is", finish_reason="length", usage=(50, 2048))])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "cut me off", ALICE)
    work(rt)
    ended = rt.store.load(run.id)
    assert ended.reason == EndReason.LENGTH
    assert ended.detail == "finish_reason length after 2048 tokens; this step allowed 2048"
    [end] = [e for e in rt.events.read(run.id) if e.kind == "run_partial"]
    console = " ".join(event_line(end, ended.created_at))
    slack = " ".join(str(b) for message in answer_messages(ended) for b in message.blocks)
    for said in (console, slack):
        assert said.count("cut off") == 1, said


def test_the_step_deadline_is_shared_by_its_attempts(model_server: FakeOpenAI) -> None:
    """Three attempts at a server that answers each after 0.8 s of silence, with a 0.5 s read
    timeout and a 2 s step: the step ends by its deadline, however many attempts fit."""
    model_server.route(
        "slow", Script(["late"], faults={0: [Fault.slow(0.8), Fault.slow(0.8), Fault.slow(0.8)]})
    )
    client = ModelClient(
        model="gpt-fake", api_key="k", base_url=model_server.url, max_retries=2, read_timeout=0.5
    )
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"did not finish within [0-9.]+ s \([23] attempts\)"):
        client.complete([{"role": "user", "content": "slow"}], [], 2.0)
    assert time.monotonic() - started < 2.0 + 0.5


def test_the_console_says_how_long_the_model_has_been_working_while_it_waits(
    redis_conn, model_server: FakeOpenAI, tickets_db, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard import console as console_module

    monkeypatch.setattr(console_module, "WAITING_EVERY", 0.3)
    model_server.route("slow sum", [Turn("It is 5.", delay=1.5)])
    rt = make_runtime(redis_conn, model_server.url)

    def one_job() -> None:
        wait_until(lambda: rt.queue.count > 0, 15.0, "the question to be queued")
        work(rt)

    worker = threading.Thread(target=one_job, daemon=True)
    worker.start()
    out = io.StringIO()
    console = console_module.Console(rt, user_id="UCON", stdin=io.StringIO(), stdout=out)
    assert console.ask_one("a slow sum: 2 + 3?")
    worker.join(10.0)
    lines = out.getvalue().splitlines()
    asked = next(n for n, line in enumerate(lines) if "asking the model: step 1" in line)
    waiting = [n for n, line in enumerate(lines) if "still waiting for the model: " in line]
    answered = next(n for n, line in enumerate(lines) if "model step 1: stop" in line)
    assert waiting and asked < waiting[0] < answered, lines
    assert lines[waiting[0]].endswith("s of 10.0 s")


class Attempts:
    """A Watch that keeps what each failed attempt was found to have cost."""

    def __init__(self) -> None:
        self.failed: list[Spent] = []

    def attempt_started(self, attempt: int, attempts: int) -> None:
        pass

    def attempt_failed(
        self, attempt: int, attempts: int, error: ModelError, spent: Spent, seconds: float
    ) -> None:
        self.failed.append(spent)

    def waiting(self, seconds: float) -> None:
        pass


WHOLE_REPLY = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
).encode()


@pytest.mark.parametrize(
    "content_type", ["text/plain;charset=UTF-8", "Application/JSON", ""], ids=repr
)
def test_a_json_reply_is_read_whatever_its_content_type_says(
    model_server: FakeOpenAI, content_type: str
) -> None:
    client = ModelClient(model="m", api_key="k", base_url=model_server.url, max_retries=0)
    model_server.route(lambda _: Recorded(content_type=content_type, body=WHOLE_REPLY))

    turn = client.complete([{"role": "user", "content": "q"}], [], 10.0)

    assert (turn.content, turn.prompt_tokens, turn.completion_tokens) == ("Hi", 3, 1)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html; charset=utf-8", b"<html><body>Sign in to the proxy</body></html>"),
        ("application/json", b"<html>not json</html>"),
        ("application/json", b'["a", "list"]'),
        ("application/json", b'{"x": "\xe9"}'),
        ("application/json", b'{"n": ' + b"9" * 5000 + b"}"),
        ("application/json", b"[" * 100_000),
    ],
    ids=["html page", "json said, html sent", "a list", "not utf-8", "huge int", "too deep"],
)
def test_a_reply_that_is_not_a_json_object_is_a_model_error_not_a_crash(
    model_server: FakeOpenAI, content_type: str, body: bytes
) -> None:
    client = ModelClient(model="m", api_key="k", base_url=model_server.url, max_retries=2)
    model_server.route(lambda _: Recorded(content_type=content_type, body=body))

    with pytest.raises(ModelError) as caught:
        client.complete([{"role": "user", "content": "q"}], [], 10.0)

    assert caught.value.detail == "the model server's reply was not a JSON object (1 attempt)"
    assert len(model_server.chat_requests) == 1  # the same proxy would answer the same


@pytest.mark.parametrize(
    "bad", [b"data: <p>\n\n", b'data: {"x": "\xe9"}\n\n'], ids=["html", "not utf-8"]
)
def test_a_streamed_part_that_is_not_json_is_a_model_error_and_its_cost_not_taken_as_none(
    model_server: FakeOpenAI, bad: bytes
) -> None:
    client = ModelClient(model="m", api_key="k", base_url=model_server.url, max_retries=2)
    chunks = (b'data: {"choices": [{"index": 0, "delta": {"content": "It is"}}]}\n\n', bad)
    model_server.route(lambda _: Recorded(content_type="text/event-stream", chunks=chunks))
    watch = Attempts()

    with pytest.raises(ModelError) as caught:
        client.complete([{"role": "user", "content": "q"}], [], 10.0, Watching(), watch=watch)

    detail = "the model server's streamed reply had a part that was not JSON (1 attempt)"
    assert caught.value.detail == detail
    assert len(model_server.chat_requests) == 1
    assert [spent.known for spent in watch.failed] == ["estimated"]  # "It is" was written


def test_a_model_server_url_that_does_not_parse_stops_the_process_at_start_up():
    """The SDK's clients are made at the first call (the bot never makes one), but a URL
    they could not be made with is refused when the client is built, as before."""
    import httpx2

    with pytest.raises(httpx2.InvalidURL, match="port"):
        ModelClient(model="m", api_key=None, base_url="http://localhost:notaport/v1")
    made = ModelClient(model="m", api_key=None, base_url="http://localhost:9/v1")
    assert made.server == "localhost:9"


# --- how a completion is posted (issue 28: the SDK's own path cost 0.3 ms more CPU a call) ---

PER_ATTEMPT = {"x-stainless-read-timeout", "content-length"}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-fake",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "It is 5."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
}
QUESTION = [{"role": "user", "content": "2 + 3?"}]


def sent_alike(model_server: FakeOpenAI, base_url: str, key: str | None) -> None:
    """One completion through `complete`, one through the SDK's own `create()`: the same
    path, body and headers, but for the attempt's own (its timeout, its length) and those
    httpx2 adds (it offers compressed replies; ours asks for none: `identity`)."""
    model_server.script = ["fine", "fine"]
    client = ModelClient(model="gpt-fake", api_key=key, base_url=base_url)
    assert client.complete(QUESTION, [], 5.0, max_tokens=8).content == "fine"
    client.client.chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": "2 + 3?"}], max_tokens=8
    )
    ours, sdks = model_server.requests[-2:]
    assert ours.path == sdks.path == "/v1/chat/completions"
    assert ours.body == sdks.body
    sent = {k.lower(): v for k, v in ours.headers.items()}
    theirs = {k.lower(): v for k, v in sdks.headers.items()}
    assert sent.pop("accept-encoding") == "identity"
    assert set(sent) == set(theirs) - {"accept-encoding", "connection"}
    assert {k: v for k, v in sent.items() if k not in PER_ATTEMPT} == {
        k: v for k, v in theirs.items() if k in sent and k not in PER_ATTEMPT
    }
    assert float(sent["x-stainless-read-timeout"]) <= 5.0


def test_a_completion_is_posted_as_the_sdk_would_post_it(
    model_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Posted beside the SDK's request building, the request must still be the SDK's: its
    # path, key, organization, every header it sends, and the same body.
    monkeypatch.setenv("OPENAI_ORG_ID", "org-switchboard")
    sent_alike(model_server, model_server.url, "sk-direct")
    sent = model_server.requests[-2].headers
    assert (sent["authorization"], sent["openai-organization"]) == (
        "Bearer sk-direct",
        "org-switchboard",
    )


def test_a_gateways_own_headers_are_sent_as_the_sdk_sends_them(
    model_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OPENAI_CUSTOM_HEADERS: a gateway's token in place of the key, and a header named in
    # another case than the SDK's own (sent once, the gateway's value).
    custom = "Authorization: Bearer gw-token\nuser-agent: corp-agent\nX-Gateway-Team: t1"
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", custom)
    sent_alike(model_server, model_server.url, "sk-direct")
    sent = model_server.requests[-2].headers
    assert (sent["authorization"], sent["user-agent"], sent["x-gateway-team"]) == (
        "Bearer gw-token",
        "corp-agent",
        "t1",
    )


def test_credentials_in_the_base_url_are_sent_as_the_sdk_sends_them(
    model_server: FakeOpenAI,
) -> None:
    # A local server behind a reverse proxy's basic auth, http://user:pass@host/v1: the SDK's
    # client sends them as Basic auth (this fake wants a key instead, and refuses).
    with_user = model_server.url.replace("http://", "http://llama:pa55@")
    client = ModelClient(model="gpt-fake", api_key=None, base_url=with_user, max_retries=0)
    with pytest.raises(ModelError, match="HTTP 401"):
        client.complete(QUESTION, [], 5.0, max_tokens=8)
    basic = "Basic " + base64.b64encode(b"llama:pa55").decode()
    assert [r.headers["authorization"] for r in model_server.requests] == [basic]


def test_a_proxy_named_in_the_environment_carries_the_completions(
    model_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A company's egress proxy, named as the SDK reads it: completions go through it too (the
    # proxy here answers nothing: the call fails, and the server never sees it).
    for name in ("NO_PROXY", "no_proxy"):  # as the SDK reads it, it would pass the proxy by
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    model_server.script = ["fine"]
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=model_server.url, max_retries=0)
    with pytest.raises(ModelError, match="could not reach"):
        client.complete(QUESTION, [], 5.0, max_tokens=8)
    assert model_server.chat_requests == []


def test_a_redirected_completion_is_followed_and_so_is_every_later_one(
    model_server: FakeOpenAI,
) -> None:
    # A gateway answering 307 (the method and the body kept; here to the same URL, twice):
    # the SDK's client follows it, and posts every later call too.
    there = Fault(status=307, headers={"location": model_server.url + "/chat/completions"})
    model_server.script = Script(["fine"], faults={0: [there, there]})
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=model_server.url)
    assert client.complete(QUESTION, [], 5.0, max_tokens=8).content == "fine"
    assert client.complete(QUESTION, [], 5.0, max_tokens=8).content == "fine"
    offered = [r.headers["accept-encoding"] for r in model_server.requests]
    # our own try, the SDK's (307 again), the one it followed; then the SDK's at once
    assert offered[0] == "identity" and len(offered) == 4
    assert all(sdks != "identity" for sdks in offered[1:])


def test_a_compressed_reply_is_read_though_none_was_asked_for(model_server: FakeOpenAI) -> None:
    # Nothing asks for compression, but a proxy may compress anyway, and say so; a reply
    # that says so and is not is a failed attempt, as through the SDK, never a crash.
    packed = gzip.compress(json.dumps(COMPLETION).encode())
    gzipped = {"Content-Encoding": "gzip"}
    model_server.route(lambda body: Recorded(body=packed, headers=gzipped))
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=model_server.url)
    turn = client.complete(QUESTION, [], 5.0, max_tokens=8)
    assert (turn.content, turn.prompt_tokens, turn.completion_tokens) == ("It is 5.", 7, 4)
    model_server.reset()
    model_server.route(lambda body: Recorded(body=b"not gzip at all", headers=gzipped))
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=model_server.url, max_retries=0)
    with pytest.raises(ModelError) as failed:
        client.complete(QUESTION, [], 5.0, max_tokens=8)
    assert failed.value.kind == "unreachable"


def test_a_cookie_the_server_sets_is_sent_back(model_server: FakeOpenAI) -> None:
    # A load balancer's affinity (AWSALB and the like), kept as the SDK's client keeps it:
    # in one jar, whether the reply comes whole or streamed.
    body = json.dumps(COMPLETION).encode()
    sticky = {"Set-Cookie": "AWSALB=backend-7; Path=/"}
    model_server.route(
        lambda asked: None if asked.get("stream") else Recorded(body=body, headers=sticky)
    )
    model_server.script = ["As streamed."]
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=model_server.url)
    for _ in range(2):
        assert client.complete(QUESTION, [], 5.0, max_tokens=8).content == "It is 5."
    streamed = client.complete(QUESTION, [], 5.0, KeptText(), max_tokens=8)
    assert streamed.content == "As streamed."
    first, *later = model_server.requests
    assert "cookie" not in first.headers
    assert [request.headers["cookie"] for request in later] == ["AWSALB=backend-7"] * 2


def test_a_connection_left_idle_is_not_written_to_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A NAT or a load balancer forgets an idle connection without a word: a request written
    # to it is never answered. Idle connections are closed after a while (the SDK's 5 s;
    # 0.2 s here), so the next call opens a new one. This server never answers a request
    # on a connection idle for more than 0.5 s.
    monkeypatch.setattr("worker.model.KEEPALIVE_SECONDS", 0.2)
    body = json.dumps(COMPLETION).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    reply += b"Content-Length: %d\r\n\r\n" % len(body) + body
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        last, pending = 0.0, b""
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                pending += data
                head, found, rest = pending.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                    if found
                    else -1
                )
                if not found or len(rest) < length:
                    continue
                pending = b""
                if last and time.monotonic() - last > 0.5:
                    continue  # forgotten: nothing comes back, and the socket stays open
                conn.sendall(reply)
                last = time.monotonic()

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                connections.append(conn)
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=url, max_retries=0)
    try:
        assert client.complete(QUESTION, [], 3.0, max_tokens=8).content == "It is 5."
        time.sleep(0.8)  # the idle time is what is tested: nothing to wait on instead
        assert client.complete(QUESTION, [], 3.0, max_tokens=8).content == "It is 5."
        assert len(connections) == 2
    finally:
        listener.close()
        for conn in connections:
            conn.close()


def test_an_error_never_quotes_the_key_even_one_http_refuses(model_server: FakeOpenAI) -> None:
    # A key pasted with a line break: HTTP refuses the header, and says so quoting it.
    client = ModelClient(
        model="gpt-fake", api_key="sk-secret-key\n", base_url=model_server.url, max_retries=0
    )
    with pytest.raises(ModelError) as failed:
        client.complete(QUESTION, [], 5.0, max_tokens=8)
    assert "could not reach" in failed.value.detail and "secret" not in failed.value.detail


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@given(
    described=st.lists(st.text(max_size=40), min_size=1, max_size=4),
    extra=st.dictionaries(st.text().filter(lambda k: k != "tools"), JSON_VALUES, max_size=4),
)
def test_a_body_with_its_tools_text_spliced_in_reads_as_the_body_encoded_whole(
    described: list[str], extra: dict[str, Any]
) -> None:
    """Each tool's entry is encoded once (Tool.openai_spec_json) and spliced into the body
    (encode_body): the server reads the same JSON as if the body were encoded at once."""
    tools = [
        make_tool(lambda: "x", effect="read", name=f"t{n}", description=f"d {text}")
        for n, text in enumerate(described)
    ]
    specs = ToolSpecs(tools)
    body = {**extra, "tools": specs}
    assert json.loads(encode_body(body)) == json.loads(json.dumps({**body, "tools": list(specs)}))
    assert json.loads(encode_body({"tools": specs})) == {"tools": list(specs)}


def test_the_offered_tools_reach_the_server_as_the_registry_declares_them(
    model_server: FakeOpenAI,
) -> None:
    """Posted directly (spliced) and streamed (through the SDK's client)."""
    model_server.script = ["fine", "fine"]
    client = ModelClient(model="gpt-fake", api_key="k", base_url=model_server.url)
    tools = [make_tool(lambda: "x", effect="read", name="lookup", description="Findé a “course”")]
    question = [{"role": "user", "content": "q"}]
    client.complete(question, ToolSpecs(tools), 5.0, max_tokens=64)
    client.complete(question, ToolSpecs(tools), 5.0, KeptText(), max_tokens=64)
    posted, streamed = model_server.chat_requests
    assert posted["tools"] == streamed["tools"] == [tools[0].openai_spec()]
    assert (posted["model"], posted["max_tokens"], streamed.get("stream")) == ("gpt-fake", 64, True)
