"""Issue 15, item 8: HTTP hygiene of `/slack/events`. The signature is checked on the raw
body before anything parses it; any malformed signature header is a 401 (never a 500 or a
traceback); connections are capped; a client that hangs up is one quiet log line.

Over real sockets to bot.transport.serve's server with the real Bolt app behind it; the signature
checker itself is property-tested at the end.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from bot.transport import signature
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import app_mention, event_callback, send_signed, signed_headers
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, SECRET, BotEnv, bot_env

HTTP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PURE = settings(max_examples=300, deadline=None)
QUESTION = event_callback(app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE))


@pytest.fixture(scope="module")
def served(
    redis_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BotEnv]:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    try:
        with bot_env(conn, fake_openai.url, tmp_path_factory.mktemp("http")) as env:
            yield env
    finally:
        conn.flushdb()
        conn.close()


def post(
    env: BotEnv, body: bytes, headers: list[tuple[str, str]]
) -> tuple[int, dict[str, str], bytes]:
    """POST with exactly these headers (repeats allowed), over a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", env.server.port, timeout=10)
    try:
        connection.putrequest("POST", "/slack/events", skip_accept_encoding=True)
        for name, value in [*headers, ("Content-Length", str(len(body)))]:
            connection.putheader(name, value.encode("utf-8"))  # "١٢٣" is not latin-1
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def signed(body: bytes, timestamp: str | None = None) -> list[tuple[str, str]]:
    ts = timestamp or str(int(time.time()))
    return [
        ("Content-Type", "application/json"),
        ("X-Slack-Request-Timestamp", ts),
        ("X-Slack-Signature", signature.sign(SECRET, ts, body)),
    ]


# -- the signature comes first ---------------------------------------------------------------------


def test_an_unsigned_body_is_refused_before_anything_reads_it(served: BotEnv) -> None:
    """Before: these were parsed first and answered 400 for their shape; now nobody's
    unsigned bytes are parsed at all."""
    with capture_logs() as logs:
        for body in (b'{"event": 5}', b"\xff\xfe{\x80}", b"[" * 10_000, b"payload=%7B"):
            status, _, _ = post(served, body, [("Content-Type", "application/json")])
            assert status == 401, body[:20]
    assert {e["event"] for e in logs} == {"request_unsigned"}
    assert served.runs() == []


def test_a_signed_body_that_is_not_utf8_is_a_400_not_a_guess(served: BotEnv) -> None:
    body = b'{"type": "event_callback", "event": "\xc3"}'
    status, _, _ = post(served, body, signed(body))
    assert status == 400


def test_a_good_signature_still_gets_through(served: BotEnv) -> None:
    body = json.dumps(event_callback(app_mention("<@UBOT> hi", user=ALICE))).encode()
    status, _, _ = post(served, body, signed(body))
    assert status == 200
    served.wait_for_runs(1)
    # the run is created before its job is queued: the tests after this one count the queue
    wait_until(lambda: served.rt.queue.count == 1, what="the run's job in the queue")


timestamps = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=30),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", " ", "1e9", "0x10", "١٢٣", "１７００００００００", "+1700000000", "-1"]),
)
signatures = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=80),
    st.text(alphabet="0123456789abcdefABCDEF", min_size=0, max_size=70).map(lambda h: "v0=" + h),
    st.sampled_from(["", "v0=", "v1=" + "0" * 64, "v0=" + "0" * 64, "V0=" + "a" * 64]),
)


@HTTP
@example(timestamp="abc", sig=None, repeat=False)  # was HTTP 500 and a traceback
@example(timestamp=None, sig="v0=" + "0" * 64, repeat=False)
@example(timestamp="1700000000 ", sig="v0=", repeat=True)
@given(
    timestamp=st.one_of(st.none(), timestamps),
    sig=st.one_of(st.none(), signatures),
    repeat=st.booleans(),
)
def test_any_malformed_signature_header_is_a_401_and_no_error(
    served: BotEnv, timestamp: str | None, sig: str | None, repeat: bool
) -> None:
    assume(timestamp is not None or sig is not None or not repeat)  # else: one good pair
    body = json.dumps(QUESTION).encode()
    queued = served.rt.queue.count
    headers = [("Content-Type", "application/json")]
    if timestamp is not None:
        headers.append(("X-Slack-Request-Timestamp", timestamp))
    if sig is not None:
        headers.append(("X-Slack-Signature", sig))
    if repeat:  # a second, well-formed pair: which one would count?
        headers += signed(body)[1:]
    with capture_logs() as logs:
        status, _, _ = post(served, body, headers)
    assert status == 401
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []
    assert served.rt.queue.count == queued


# -- connections -----------------------------------------------------------------------------------


def test_connections_past_the_cap_get_a_503_without_a_thread(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """Before: one thread per connection, however many; two idle sockets held two threads
    and a third connection got a third."""
    with bot_env(redis_conn, model_server.url, tmp_path, max_connections=2) as env:
        idle = [socket.create_connection(("127.0.0.1", env.server.port)) for _ in range(2)]
        try:
            third = http.client.HTTPConnection("127.0.0.1", env.server.port, timeout=5)
            third.request("GET", "/healthz")
            refused = third.getresponse()
            assert refused.status == 503
            assert refused.getheader("Retry-After") == "1"
        finally:
            for sock in idle:
                sock.close()

        def healthy() -> bool:  # the idle connections' threads end and free their slots
            connection = http.client.HTTPConnection("127.0.0.1", env.server.port, timeout=5)
            try:
                connection.request("GET", "/healthz")
                return connection.getresponse().status == 200
            finally:
                connection.close()

        wait_until(healthy, what="a free connection slot")


def test_a_client_that_hangs_up_mid_request_is_one_quiet_line(
    served: BotEnv, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before: socketserver printed "Exception occurred during processing of request" and
    a ConnectionResetError traceback to stderr for every reset connection."""
    capfd.readouterr()
    with capture_logs() as logs:
        sock = socket.create_connection(("127.0.0.1", served.server.port))
        sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Type: applic")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, as a client that crashed or timed out sends
        wait_until(
            lambda: any(e["event"] == "http_connection_aborted" for e in logs),
            what="the aborted connection to be logged",
        )
    [aborted] = [e for e in logs if e["event"] == "http_connection_aborted"]
    assert aborted["log_level"] == "info" and aborted["error"] == "ConnectionResetError"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err


def test_a_stale_or_forged_request_still_never_reaches_bolt(served: BotEnv) -> None:
    body = json.dumps(QUESTION)
    stale = send_signed(served.url, SECRET, body, timestamp=int(time.time()) - 301)
    forged = send_signed(served.url, "another-secret", body)
    assert (stale.status, forged.status) == (401, 401)
    headers = signed_headers(SECRET, body)
    assert send_signed(served.url, SECRET, body, headers=headers).status == 200


# -- the checker -----------------------------------------------------------------------------------

header_text = st.text(max_size=80)


@PURE
@given(
    secret=st.text(min_size=1, max_size=40),
    body=st.binary(max_size=300),
    skew=st.integers(min_value=-signature.MAX_SKEW, max_value=signature.MAX_SKEW),
)
def test_a_signature_made_with_the_secret_is_accepted_within_five_minutes(
    secret: str, body: bytes, skew: int
) -> None:
    now = 1_700_000_000
    ts = str(now + skew)
    assert signature.problem(secret, [ts], [signature.sign(secret, ts, body)], body, now) is None


@PURE
@given(
    secret=st.text(min_size=1, max_size=40),
    body=st.binary(max_size=300),
    change=st.sampled_from(["body", "secret", "timestamp", "signature", "stale"]),
    data=st.data(),
)
def test_any_change_to_a_signed_request_is_refused(
    secret: str, body: bytes, change: str, data: st.DataObject
) -> None:
    now = 1_700_000_000
    ts = str(now)
    sig = signature.sign(secret, ts, body)
    check_secret, check_ts, check_body = secret, ts, body
    if change == "body":
        check_body = data.draw(st.binary(max_size=300).filter(lambda b: b != body))
    elif change == "secret":
        check_secret = data.draw(st.text(min_size=1, max_size=40).filter(lambda s: s != secret))
    elif change == "timestamp":
        check_ts = str(now + data.draw(st.integers(1, signature.MAX_SKEW)))
    elif change == "signature":
        position = data.draw(st.integers(3, len(sig) - 1))
        digit = data.draw(st.sampled_from("0123456789abcdef").filter(lambda d: d != sig[position]))
        sig = sig[:position] + digit + sig[position + 1 :]
    else:
        check_ts = str(now - signature.MAX_SKEW - data.draw(st.integers(1, 10**6)))
        sig = signature.sign(secret, check_ts, body)
    assert signature.problem(check_secret, [check_ts], [sig], check_body, now) is not None


@PURE
@given(
    timestamps=st.lists(header_text, max_size=3),
    signatures=st.lists(header_text, max_size=3),
    body=st.binary(max_size=100),
)
def test_the_checker_never_raises_and_refuses_what_is_not_one_good_pair(
    timestamps: list[str], signatures: list[str], body: bytes
) -> None:
    found: Any = signature.problem("secret", timestamps, signatures, body, 1_700_000_000)
    assert isinstance(found, str)  # arbitrary text is never a valid signature
