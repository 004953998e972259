"""Issue 22, item 11: more than one signing secret, so one can be rotated.

`SLACK_SIGNING_SECRET` is the current one; `SLACK_SIGNING_SECRET_PREVIOUS` (comma-separated)
are accepted too. Checked end to end over HTTP (the server's check and Bolt's), Bolt's
check on its own (`App.dispatch`, as Socket Mode and any other server would reach it), the
settings, and the checker as a property.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pydantic
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_bolt import BoltRequest

from bot.transport import signature
from switchboard.settings import Config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import app_mention, event_callback, send_signed, signed_headers
from tests.support.slack_bot import ALICE, BotEnv, bot_env

NEW, OLD = "the-new-signing-secret", "the-old-signing-secret"


@pytest.fixture
def rotating(redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path, signing_secrets=(NEW, OLD)) as env:
        yield env


def question(n: int) -> str:
    return json.dumps(event_callback(app_mention(f"<@UBOT> question {n}", user=ALICE)))


def test_requests_signed_with_the_new_or_the_previous_secret_pass_and_a_wrong_one_fails(
    rotating: BotEnv,
) -> None:
    statuses = [send_signed(rotating.url, s, question(n)).status for n, s in enumerate([NEW, OLD])]
    wrong = send_signed(rotating.url, "a-secret-nobody-configured", question(2))
    assert statuses == [200, 200]
    assert wrong.status == 401
    runs = rotating.wait_for_runs(2)
    assert sorted(r.question for r in runs) == ["question 0", "question 1"]


def test_bolts_own_check_knows_every_secret_too(rotating: BotEnv) -> None:
    """Bolt verifies again behind the server: with only the current secret it would
    refuse what the server let through (and whatever reaches `dispatch` another way)."""
    app = rotating.server.app

    def dispatch(secret: str, n: int) -> int:
        body = question(n)
        headers: dict[str, str | Sequence[str]] = {
            k.lower(): [v] for k, v in signed_headers(secret, body).items()
        }
        return app.dispatch(BoltRequest(body=body, headers=headers)).status

    assert dispatch(OLD, 3) == 200
    assert dispatch(NEW, 4) == 200
    assert dispatch("a-secret-nobody-configured", 5) == 401


def test_the_previous_secrets_come_from_their_own_variable_and_the_old_one_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "current")
    assert Config(_env_file=None).signing_secrets == ("current",)
    monkeypatch.setenv("SLACK_SIGNING_SECRET_PREVIOUS", " old-1, old-2 ,")
    assert Config(_env_file=None).signing_secrets == ("current", "old-1", "old-2")
    monkeypatch.setenv("SLACK_SIGNING_SECRET_PREVIOUS", "a,b,c,d")
    with pytest.raises(pydantic.ValidationError, match="at most 3 previous signing secrets"):
        Config(_env_file=None)


secret_text = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1)


@settings(max_examples=200, deadline=None)
@given(
    secrets=st.lists(secret_text, min_size=1, max_size=signature.MAX_SECRETS, unique=True),
    which=st.integers(min_value=0),
    outsider=secret_text,
    body=st.binary(max_size=200),
)
def test_a_request_signed_with_any_configured_secret_passes_and_no_other_does(
    secrets: list[str], which: int, outsider: str, body: bytes
) -> None:
    now = int(time.time())
    ts = str(now)
    chosen = secrets[which % len(secrets)]
    assert signature.problem(secrets, [ts], [signature.sign(chosen, ts, body)], body, now) is None
    if outsider not in secrets:
        forged = signature.sign(outsider, ts, body)
        assert signature.problem(secrets, [ts], [forged], body, now) == "wrong signature"


def test_no_secret_at_all_refuses_everything() -> None:
    body, ts = b"{}", str(int(time.time()))
    assert signature.problem([], [ts], [signature.sign("", ts, body)], body) is not None
    assert signature.problem("", [ts], [signature.sign("", ts, body)], body) is not None
