"""Issue 5: fuzz the Slack payload handling. Odd but correctly signed bodies go over HTTP to
the served Bolt app; whatever arrives, the server answers (2xx/4xx, never 5xx or a dropped
connection), nothing logs an unhandled exception, and input that is not a valid question
enqueues nothing and leaves no Redis key but the event de-duplication markers.

The pure parsers the bot relies on (command arguments, mention stripping, id shapes, the
envelope check, mrkdwn escaping and splitting) are property-tested at the end.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from bot.render.blocks import APPROVE, CANCEL, REJECT, REJECT_MODAL, SAVE_DEMO, SHOW_ARGS, VIEW_RUN
from bot.render.mrkdwn import code, code_block, cut, escape, one_line, split, to_mrkdwn
from bot.transport import envelope, ids
from bot.transport.payloads import question_text
from bot.transport.slash import MAX_TEXT, parse
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import (
    app_mention,
    block_actions,
    event_callback,
    form_payload,
    message_im,
    send_signed,
    slash_command,
    view_submission,
)
from tests.support.slack_bot import ADMIN, ALICE, BotEnv, bot_env
from worker.service.asking import MAX_QUESTION_CHARS

HTTP = settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PURE = settings(max_examples=200, deadline=None)
BOT = "UBOT"
# What a request that starts nothing may leave: its delivery's de-duplication mark, and the
# shared cache of Slack's user groups (read to learn who is asking).
DEDUPE = re.compile(rb"sb:slack:event:Ev[A-Za-z0-9]+|sb:usergroups")


# -- one served app for the module -----------------------------------------------------------------


class ErrorRecords(logging.Handler):
    """stdlib log records at ERROR and above (Bolt logs its own failures this way)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Served:
    env: BotEnv
    errors: ErrorRecords

    def settle(self) -> None:
        """Wait until every listener started so far has finished (one listener thread, so a
        no-op queued behind them runs last)."""
        executor = self.env.server.app.listener_runner.listener_executor
        executor.submit(lambda: None).result(timeout=10)


@pytest.fixture(scope="module")
def served(
    redis_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    errors = ErrorRecords()
    logging.getLogger().addHandler(errors)
    try:
        with bot_env(
            conn, fake_openai.url, tmp_path_factory.mktemp("fuzz"), listener_threads=1
        ) as env:
            yield Served(env, errors)
    finally:
        logging.getLogger().removeHandler(errors)
        conn.flushdb()
        conn.close()


@dataclass
class Delivery:
    status: int
    logs: list[MutableMapping[str, Any]]  # as structlog's capture_logs gives them
    keys: list[bytes]


def deliver(
    served: Served,
    body: str | dict[str, Any],
    *,
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
) -> Delivery:
    """Send one signed request to a clean bot; wait for its listeners; report what it did."""
    env = served.env
    env.rt.redis.flushdb()
    env.slack.reset()
    served.errors.records.clear()
    extra = dict(headers or {})
    if content_type is not None:
        extra["Content-Type"] = content_type
    with capture_logs() as logs:
        response = env.post(body, headers=extra)  # a dropped connection raises here
        served.settle()
    assert response.status < 500, (response.status, response.body)
    failures = [e for e in logs if e.get("log_level") in ("error", "critical", "exception")]
    assert failures == [], failures
    assert [r.getMessage() for r in served.errors.records] == []
    return Delivery(response.status, logs, sorted(env.rt.redis.keys("*")))


def assert_nothing_started(served: Served, delivery: Delivery) -> None:
    assert served.env.rt.queue.count == 0
    assert served.env.runs() == []
    assert [k for k in delivery.keys if not DEDUPE.fullmatch(k)] == []


def test_log_capture_sees_the_listeners(served: Served) -> None:
    """Guards the fuzz properties below against passing vacuously: if structlog were
    configured to cache its loggers, `capture_logs` would see nothing."""
    delivery = deliver(served, block_actions(APPROVE, "not-an-approval-id", user_id=ALICE))
    assert delivery.status == 200
    assert any(e["event"] == "action_value_rejected" for e in delivery.logs), (
        "structlog output is not captured (was it configured with cache_logger_on_first_use "
        "by an earlier test?); the fuzz tests below would pass without looking"
    )


# -- strategies ------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
odd_text = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
    st.sampled_from(
        [
            "<!channel>",
            "<!here> <@UALICE> <#C0001>",
            "&lt;!everyone&gt;",
            "\u202e\u200b\ufeff",
            "\x00\x01\x7f",
            "```",
            "x" * 5000,
            "é" * 70_000,
        ]
    ),
)
near_miss_ids = st.sampled_from(
    [
        "",
        " ",
        "ualice",
        "U",
        "UALICE\n",
        "UALICE ",
        "<@UALICE>",
        "C0001\n",
        "c0001",
        "1700000000",
        "1700000000.000100\n",
        "1700000000.000100x",
        "Ev",
        "Ev0001!",
        "r0123456789abcdef\n",
        "ap_0123456789abcdef\n",
        "ap_" + "0" * 65,
    ]
)
# never the right shape: not a string, or a string with a character no id may contain
bad_id = st.one_of(
    junk.filter(lambda v: v is not None and not isinstance(v, str)),
    near_miss_ids,
    st.text(max_size=20).map(lambda s: s + "!"),
)
any_id = st.one_of(
    st.sampled_from([ALICE, ADMIN, "C0001", "D0001", "1700000000.000100", "r0123456789abcdef"]),
    bad_id,
)


@st.composite
def malformed_event(draw: st.DrawFn) -> dict[str, Any]:
    """An event_callback that is not a valid question, however else it looks."""
    event: dict[str, Any] = draw(
        st.sampled_from(
            [
                app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE),
                message_im("what does SQL Basics cost?", user=ALICE),
                message_im("a reply", user=ALICE, thread_ts="1700000000.000100"),
                {
                    "type": "assistant_thread_started",
                    "assistant_thread": {
                        "user_id": ALICE,
                        "channel_id": "D0001",
                        "thread_ts": "1700000000.000100",
                        "context": {},
                    },
                    "event_ts": "1700000000.000100",
                },
                {"type": "app_home_opened", "user": ALICE, "tab": "home", "channel": "D0HOME"},
            ]
        )
    )
    body = event_callback(event)
    event = body["event"]  # the envelope holds a copy
    breaks = {
        "drop a required field": lambda: event.pop(
            draw(st.sampled_from(["user", "channel", "ts", "type"])), None
        ),
        "bad user": lambda: event.__setitem__("user", draw(bad_id)),
        "bad channel": lambda: event.__setitem__("channel", draw(bad_id)),
        "bad ts": lambda: event.__setitem__("ts", draw(bad_id)),
        "bad thread_ts": lambda: event.__setitem__("thread_ts", draw(bad_id)),
        "bad text": lambda: event.__setitem__(
            "text", draw(junk.filter(lambda v: v and not isinstance(v, str)))
        ),
        "not a person": lambda: event.update(
            draw(
                st.sampled_from(
                    [
                        {"bot_id": "B0001"},
                        {"subtype": "message_changed"},
                        {"subtype": "bot_message"},
                    ]
                )
            )
        ),
        "another type": lambda: event.__setitem__(
            "type", draw(junk.filter(lambda t: t not in ("app_mention", "message")))
        ),
        "bad event id": lambda: body.__setitem__(
            "event_id", draw(st.one_of(bad_id, st.just(None)))
        ),
        "bad assistant thread": lambda: event.__setitem__("assistant_thread", draw(junk)),
        "channel chatter": lambda: event.update({"type": "message", "channel_type": "channel"}),
    }
    applicable = {
        "app_home_opened": ["drop a required field", "bad user", "another type", "bad event id"],
        "assistant_thread_started": ["bad assistant thread", "another type", "bad event id"],
    }.get(event["type"], [name for name in breaks if name != "bad assistant thread"])
    for name in draw(st.lists(st.sampled_from(applicable), min_size=1, max_size=3, unique=True)):
        breaks[name]()
    thread = event.get("assistant_thread")
    if event.get("type") == "assistant_thread_started" and isinstance(thread, dict):
        thread.pop(draw(st.sampled_from(["channel_id", "thread_ts"])), None)  # still broken
    envelope_junk = st.sampled_from(
        ["type", "event", "authorizations", "team", "user", "enterprise", "is_ext_shared_channel"]
    )
    body.update(draw(st.dictionaries(envelope_junk, junk, max_size=2)))
    unread = st.sampled_from(["blocks", "files", "attachments", "edited", "client_msg_id"])
    event.update(draw(st.dictionaries(unread, junk, max_size=2)))
    return body


# -- events ----------------------------------------------------------------------------------------


@HTTP
@given(body=malformed_event())
def test_malformed_events_are_answered_and_start_nothing(
    served: Served, body: dict[str, Any]
) -> None:
    delivery = deliver(served, body)
    assert delivery.status in (200, 400, 404)
    assert_nothing_started(served, delivery)


@HTTP
@given(
    text=st.one_of(st.text(max_size=300), st.text(min_size=3990, max_size=4010, alphabet="ab \n")),
    dm=st.booleans(),
    extra=st.dictionaries(
        st.sampled_from(["blocks", "files", "attachments", "edited", "client_msg_id"]),
        junk,
        max_size=2,
    ),
)
def test_well_formed_questions_start_exactly_one_run_when_they_can(
    served: Served, text: str, dm: bool, extra: dict[str, Any]
) -> None:
    typed = escape(text)  # Slack escapes what people type
    event = message_im(typed, user=ALICE) if dm else app_mention(f"<@{BOT}> {typed}", user=ALICE)
    event.update(extra)
    delivery = deliver(served, event_callback(event))
    assert delivery.status == 200
    question = text.strip()
    an_edit = extra.get("edited") is not None  # an edit re-sends a question already asked
    if 0 < len(question) <= MAX_QUESTION_CHARS and not an_edit:
        [run] = served.env.runs()
        assert run.question == question and run.requester.user_id == ALICE
        assert served.env.rt.queue.count == 1
    else:
        assert_nothing_started(served, delivery)


@HTTP
@given(challenge=junk)
def test_url_verification_echoes_the_challenge(served: Served, challenge: Any) -> None:
    delivery = deliver(served, {"type": "url_verification", "token": "x", "challenge": challenge})
    assert delivery.status == 200
    assert_nothing_started(served, delivery)


# -- clicks, modal submissions, slash commands -----------------------------------------------------

action_ids = st.one_of(
    st.sampled_from([APPROVE, REJECT, CANCEL, SHOW_ARGS, VIEW_RUN, SAVE_DEMO]), st.text(max_size=20)
)
values = st.one_of(
    st.sampled_from(["ap_0123456789abcdef", "r0123456789abcdef", "ap_", "r"]),
    near_miss_ids,
    st.text(max_size=100),
    st.just("ap_" + "a" * 100_000),
)


@st.composite
def click_payload(draw: st.DrawFn) -> dict[str, Any]:
    raw = block_actions(
        draw(action_ids),
        "",
        user_id=draw(st.sampled_from([ALICE, ADMIN, "USTRANGER"])),
        view=draw(
            st.one_of(
                st.none(),
                st.just({"id": "V00000001", "type": "modal"}),
                st.just({"id": "V1", "type": "home"}),
            )
        ),
    )
    payload: dict[str, Any] = json.loads(dict(_form(raw))["payload"])
    payload["actions"][0]["value"] = draw(st.one_of(values, junk))
    for key, value in draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "user",
                    "container",
                    "trigger_id",
                    "channel",
                    "message",
                    "team",
                    "view",
                    "state",
                    "response_url",
                ]
            ),
            junk,
            max_size=3,
        )
    ).items():
        payload[key] = value
    if draw(st.booleans()):
        payload["actions"][0].update(
            draw(
                st.dictionaries(
                    st.sampled_from(["action_id", "block_id", "type", "value"]), junk, max_size=2
                )
            )
        )
    if draw(st.integers(0, 9)) == 0:
        payload["actions"] = draw(junk)
    return payload


def _form(body: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(body, keep_blank_values=True)


@HTTP
@given(payload=click_payload())
def test_odd_clicks_are_answered_and_start_nothing(served: Served, payload: dict[str, Any]) -> None:
    delivery = deliver(served, form_payload(payload))
    assert delivery.status in (200, 400, 404)
    assert_nothing_started(served, delivery)


@HTTP
@given(
    metadata=st.one_of(junk.map(json.dumps), st.text(max_size=200), st.just("x" * 5000)),
    state=junk,
    user=any_id,
    callback=st.one_of(st.just(REJECT_MODAL), st.text(max_size=10)),
)
def test_odd_modal_submissions_are_answered_and_start_nothing(
    served: Served, metadata: str, state: Any, user: Any, callback: str
) -> None:
    raw = view_submission(callback, private_metadata=metadata, user_id=ALICE)
    payload = json.loads(dict(_form(raw))["payload"])
    payload["view"]["state"] = state
    payload["user"] = {"id": user}
    delivery = deliver(served, form_payload(payload))
    assert delivery.status in (200, 400, 404)
    assert_nothing_started(served, delivery)


@HTTP
@given(
    text=st.one_of(
        odd_text,
        st.sampled_from(["help", "runs all", "runs <@UALICE|a> failed", "run r0123456789abcdef"]),
        st.sampled_from(["run", "cancel", "runs"]).flatmap(
            lambda verb: any_id.map(lambda i: f"{verb} {i}")
        ),
    ),
    user=any_id,
    channel=any_id,
    fields=st.dictionaries(
        st.sampled_from(["trigger_id", "response_url", "team_id", "command"]),
        st.text(max_size=30),
        max_size=2,
    ),
)
def test_odd_slash_commands_are_answered_and_start_nothing(
    served: Served, text: str, user: Any, channel: Any, fields: dict[str, str]
) -> None:
    form = dict(_form(slash_command("/switchboard", text)))
    form.update({"user_id": str(user), "channel_id": str(channel), **fields})
    delivery = deliver(served, urlencode(form))
    assert delivery.status in (200, 404)
    assert_nothing_started(served, delivery)


# -- bodies that are not Slack's at all ------------------------------------------------------------


@HTTP
@given(
    body=st.one_of(
        st.text(max_size=200),
        junk.map(json.dumps),
        st.sampled_from(
            [
                "{",
                "[1, 2]",
                "null",
                "payload=",
                "payload=%7B",
                "payload=%5B%5D",
                "payload=null",
                "[" * 50_000,
            ]
        ),
        junk.map(lambda v: urlencode({"payload": json.dumps(v)})),
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "event",
                    "actions",
                    "view",
                    "command",
                    "user",
                    "team",
                    "authorizations",
                    "response_urls",
                    "channel",
                    "enterprise",
                    "message",
                    "ssl_check",
                    "token",
                ]
            ),
            junk,
            max_size=5,
        ).map(json.dumps),
    ),
    content_type=st.one_of(
        st.none(),
        st.sampled_from(
            [
                "application/json",
                "application/x-www-form-urlencoded",
                "text/plain",
                "multipart/form-data; boundary=x",
                "application/json; charset=utf-8",
                "",
            ]
        ),
    ),
)
def test_bodies_that_are_not_slack_payloads_are_refused_without_a_trace(
    served: Served, body: str, content_type: str | None
) -> None:
    delivery = deliver(served, body, content_type=content_type)
    assert 200 <= delivery.status < 500
    assert_nothing_started(served, delivery)


def test_undecodable_bytes_and_unsigned_junk_are_refused(served: Served) -> None:
    for data in (b"\xff\xfe{\x80}", b'{"type": "event_callback", "event": "\xc3"}'):
        request = urllib.request.Request(
            served.env.url, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        assert status in (400, 401)
    unsigned = send_signed(served.env.url, "wrong-secret", '{"type": "event_callback", "event": 1}')
    assert unsigned.status in (400, 401)
    assert served.env.runs() == []


# -- the pure parsers ------------------------------------------------------------------------------

PINGS = ("<!", "<@", "<#")
markdownish = st.text(
    alphabet=st.sampled_from(list("<>&!@#|[]()*_~`:/ hetps.\nab")) | st.characters(), max_size=300
)


@PURE
@given(text=st.one_of(st.text(max_size=400), markdownish))
def test_escaping_never_lets_model_text_ping_mention_or_link(text: str) -> None:
    for shown in (
        escape(text),
        one_line(text, 200),
        code(text),
        code_block(text),
        cut(escape(text), 50),
    ):
        assert not any(p in shown for p in PINGS), shown
        assert "<" not in shown
    converted = to_mrkdwn(text)
    assert not any(p in converted for p in PINGS)
    for link in re.findall(r"<[^>]*>?", converted):  # a label naming another address: `<url>`
        assert re.fullmatch(r"<https?://[^\s()<>|]+(\|[^\[\]\n|<>]+)?>", link), link


fenced = st.lists(
    st.sampled_from(["```", "``", "a", "aaaaaaa", "bbbbbbbbbbbbbbbbb", " ", "\n", "&", "<"]),
    max_size=60,
).map("".join)


@PURE
@example(text="a" * 11 + "```" + "b" * 9, limit=20)  # once cut inside the fence
@given(
    text=st.one_of(st.text(max_size=2000), markdownish, fenced),
    limit=st.integers(min_value=20, max_value=400),
)
def test_split_keeps_the_text_within_the_limit_with_fences_balanced(text: str, limit: int) -> None:
    assume(re.search("`{7,}", text) is None)  # a longer run of backticks may be cut
    shown = escape(text)
    pieces = split(shown, limit)
    assert all(len(piece) <= limit for piece in pieces), [len(p) for p in pieces]
    assert all(piece.count("```") % 2 == 0 for piece in pieces)
    squeezed = lambda s: re.sub(r"\s", "", s.replace("```", ""))  # noqa: E731
    expected = squeezed(shown)
    assert "".join(squeezed(p) for p in pieces).replace(".", "") == expected.replace(".", "")


@PURE
@given(text=st.text(max_size=300), limit=st.integers(min_value=1, max_value=100))
def test_cut_is_within_the_limit_and_never_splits_an_entity(text: str, limit: int) -> None:
    shown = cut(escape(text), limit)
    assert len(shown) <= limit
    assert re.search(r"&[a-z]*$", shown.removesuffix("…")) is None


@PURE
@given(text=st.text(max_size=300), name=st.sampled_from(["", "|switchboard", "|Switch Board"]))
def test_question_text_drops_the_bots_mentions_and_undoes_slacks_escaping(
    text: str, name: str
) -> None:
    assert question_text(f"<@{BOT}{name}> {escape(text)}", BOT) == text.strip()
    assert question_text(escape(text), BOT) == text.strip()
    assume("&" not in text)
    assert re.search(rf"<@{BOT}(\|[^>]*)?>", question_text(text, BOT)) is None
    assert question_text("<@UBOT2> hi", BOT) == "<@UBOT2> hi"


@PURE
@given(
    text=st.text(
        alphabet=st.characters(codec="utf-8") | st.characters(categories=["Cs"]), max_size=50
    )
)
def test_question_text_is_always_encodable(text: str) -> None:
    question_text(text, BOT).encode("utf-8")


@PURE
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "run",
                    "runs",
                    "cancel",
                    "help",
                    "all",
                    "mine",
                    "failed",
                    "<@UALICE|a>",
                    "UBOB",
                    "r0123456789abcdef",
                    "`r0123456789abcdef`",
                    "r0123\n",
                ]
            ),
            max_size=4,
        ).map(" ".join),
    )
)
def test_the_command_parser_never_raises_and_only_yields_well_formed_ids(text: str) -> None:
    command = parse(text)
    assert command.verb in ("runs", "run", "cancel", "help", "error")
    if len(text) > MAX_TEXT:
        assert command.verb == "error"
    if command.verb in ("run", "cancel"):
        assert command.run_id is not None and ids.RUN.fullmatch(command.run_id)
    if command.user is not None:
        assert ids.USER.fullmatch(command.user)
    assert not any(p in command.error for p in ("<!", "<@", "<#"))


@PURE
@given(
    run_id=st.from_regex(ids.RUN, fullmatch=True), verb=st.sampled_from(["run", "cancel", "RUN"])
)
def test_the_command_parser_reads_every_well_formed_run_id(run_id: str, verb: str) -> None:
    assert parse(f"{verb} `{run_id}`").run_id == run_id


@PURE
@given(value=st.one_of(junk, near_miss_ids, st.from_regex(ids.USER, fullmatch=True)))
def test_ids_are_accepted_only_in_full_and_only_as_strings(value: Any) -> None:
    accepted = ids.shaped(ids.USER, value)
    assert accepted is None or (isinstance(value, str) and accepted == value and "\n" not in value)
    for pattern in (ids.USER, ids.CHANNEL, ids.TS, ids.RUN, ids.APPROVAL, ids.EVENT):
        assert ids.shaped(pattern, f"{value}\n") is None


@PURE
@given(
    body=st.one_of(
        junk,
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "event",
                    "actions",
                    "view",
                    "user",
                    "team",
                    "channel",
                    "authorizations",
                    "response_urls",
                    "message",
                    "container",
                    "enterprise",
                ]
            ),
            junk,
            max_size=6,
        ),
    )
)
def test_the_envelope_check_never_raises(body: Any) -> None:
    if isinstance(body, dict):
        envelope.problem(body)
    assert envelope.parse(json.dumps(body), "application/json") == (
        body if isinstance(body, dict) else None
    )
