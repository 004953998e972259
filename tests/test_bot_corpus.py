"""Issue 15, item 10: 97 real Slack payloads (`../shared/slack-payloads`: Slack's SDK test
suites, its docs and captures; SOURCES.md names each origin) replayed over HTTP, signed, to
the real Bolt app behind bot.transport.serve's server, with FakeSlack as the Web API. Each
is checked against the handling `cases.json` expects: the HTTP status, how many runs it
started, the Web API methods the bot called, the url_verification challenge. No payload may
reach Slack as Bolt's 404 "unhandled request", and nothing may log an error.

The payloads are third-party data: they are read where they are, never copied here, and the
test is skipped when the folder is not there. Each payload is adapted only as cases.json
says (`idmap`, `overrides`, `form_overrides`, a fresh `event_id`), and the bot is started as
if installed in the workspace the payload came from (FakeSlack's `auth.test` answers with
the payload's team and app), so the default origin check applies unchanged.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
import redis
from structlog.testing import capture_logs

from bot.outbound.slack_surface import SlackSurface
from bot.state.threads import Threads
from bot.transport.serve import build_app
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack, SignedResponse, send_signed
from tests.support.runtime import make_runtime, work
from tests.support.slack_bot import SECRET, TOKEN, fresh_logging, serving
from worker.runtime import Runtime

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "slack-payloads"
BOT_USER = "U0BOT"  # what cases.json's idmap maps the installed bot's ids to
BOT_ID = "B0BOT"
SEEDED_RUN = "r00000000000000aa"  # thread memory seeded "as if the bot had answered there"

pytestmark = pytest.mark.skipif(
    not (CORPUS / "cases.json").is_file(), reason=f"no Slack payload corpus at {CORPUS}"
)


def load_cases() -> list[dict[str, Any]]:
    if not (CORPUS / "cases.json").is_file():
        return []
    cases: list[dict[str, Any]] = json.loads((CORPUS / "cases.json").read_text())
    return cases


def units(cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One case each, except a `group`: its cases in order against one bot."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    out: list[list[dict[str, Any]]] = []
    for case in cases:
        group = case.get("group")
        if group is None:
            out.append([case])
        elif group in grouped:
            grouped[group].append(case)
        else:
            grouped[group] = [case]
            out.append(grouped[group])
    return out


UNITS = units(load_cases())


# -- adapting a payload as cases.json says ---------------------------------------------------------

_event_ids = itertools.count(1)


def lenient_json(text: str) -> Any:
    """Three docs examples are invalid JSON as published (a trailing comma)."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(re.sub(r",(\s*[}\]])", r"\1", text))


def map_ids(value: Any, idmap: dict[str, str]) -> Any:
    """Every id in `idmap` replaced wherever it occurs as a whole word in a string."""
    if isinstance(value, str):
        for old, new in idmap.items():
            value = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])", new, value)
        return value
    if isinstance(value, dict):
        return {k: map_ids(v, idmap) for k, v in value.items()}
    if isinstance(value, list):
        return [map_ids(v, idmap) for v in value]
    return value


def set_path(data: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        data = data[int(key)] if isinstance(data, list) else data[key]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


@dataclass(frozen=True)
class Prepared:
    body: str
    content_type: str
    team: str  # the workspace it was delivered for (FakeSlack's auth.test answers with it)
    app: str


def prepare(case: dict[str, Any]) -> Prepared:
    raw = (CORPUS / case["file"]).read_text(encoding="utf-8")
    idmap = case.get("idmap") or {}
    if case["format"] == "form":
        form = dict(parse_qsl(raw.strip(), keep_blank_values=True))
        form = {k: map_ids(v, idmap) for k, v in form.items()}
        form.update(case.get("form_overrides") or {})
        return Prepared(
            urlencode(form),
            "application/x-www-form-urlencoded",
            form.get("team_id", ""),
            form.get("api_app_id", ""),
        )
    payload = map_ids(lenient_json(raw), idmap)
    for path, value in (case.get("overrides") or {}).items():
        set_path(payload, path, value)
    if isinstance(payload, dict) and "event_id" in payload and not case.get("keep_event_id"):
        payload["event_id"] = f"Ev{next(_event_ids):04d}{int(time.time())}"
    team, app = delivered_for(payload)
    if case["format"] == "interactive":
        body = urlencode({"payload": json.dumps(payload)})
        return Prepared(body, "application/x-www-form-urlencoded", team, app)
    return Prepared(json.dumps(payload), "application/json", team, app)


def delivered_for(payload: Any) -> tuple[str, str]:
    if not isinstance(payload, dict):
        return "", ""
    team = payload.get("team_id") or payload.get("team") or ""
    if isinstance(team, dict):
        team = team.get("id") or ""
    app = payload.get("api_app_id") or ""
    return (team if isinstance(team, str) else ""), (app if isinstance(app, str) else "")


# -- the bot -------------------------------------------------------------------------------------


class SlackWarnings(logging.Handler):
    """Bolt's own log records at WARNING and above ("Unhandled request ...", failures)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("slack_bolt") or record.levelno >= logging.ERROR:
            self.records.append(record)


@dataclass
class Replay:
    rt: Runtime
    slack: FakeSlack
    warnings: SlackWarnings


@pytest.fixture(scope="module")
def replay(
    redis_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replay]:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    fresh_logging()
    warnings = SlackWarnings()
    logging.getLogger().addHandler(warnings)
    rt = make_runtime(conn, fake_openai.url)
    try:
        with FakeSlack(bot_user_id=BOT_USER, bot_id=BOT_ID) as slack:
            surface = SlackSurface(slack_client(slack), rt, update_interval=0.05)
            rt.surfaces["slack"] = surface
            try:
                yield Replay(rt, slack, warnings)
            finally:
                surface.close()
    finally:
        logging.getLogger().removeHandler(warnings)
        conn.flushdb()
        conn.close()


def slack_client(slack: FakeSlack) -> Any:
    from slack_sdk import WebClient

    return WebClient(token=TOKEN, base_url=slack.url)


@dataclass
class Outcome:
    statuses: list[int]
    runs: int
    calls: list[str]
    body: str
    logs: list[MutableMapping[str, Any]]  # as structlog's capture_logs gives them


def deliver(replay: Replay, case: dict[str, Any], url: str, settle: Any) -> Outcome:
    prepared = prepare(case)
    secret = "not-the-signing-secret" if case.get("sign") == "bad_secret" else SECRET
    timestamp = int(time.time()) - 600 if case.get("sign") == "stale" else None
    before_runs = len(replay.rt.store.recent(limit=1000))
    before_calls = len(replay.slack.call_log)
    responses: list[SignedResponse] = []
    with capture_logs() as logs:
        for n in range(int(case.get("deliveries", 1))):
            retry = {"X-Slack-Retry-Num": str(n), "X-Slack-Retry-Reason": "http_timeout"}
            headers = {"Content-Type": prepared.content_type, **(retry if n else {})}
            responses.append(
                send_signed(url, secret, prepared.body, timestamp=timestamp, headers=headers)
            )
            settle()
    runs = len(replay.rt.store.recent(limit=1000)) - before_runs
    if runs:
        work(replay.rt)  # answered, so the next message in its thread continues it
    calls = [call.method for call in replay.slack.call_log[before_calls:]]
    return Outcome([r.status for r in responses], runs, calls, responses[-1].body, logs)


def problems(case: dict[str, Any], outcome: Outcome) -> list[str]:
    expect = case["expect"]
    found: list[str] = []
    wanted = {"2xx": range(200, 300), "4xx": range(400, 500)}[expect["status"]]
    if any(status not in wanted for status in outcome.statuses):
        found.append(f"status {outcome.statuses}, expected {expect['status']}")
    if outcome.runs != expect["runs"]:
        found.append(f"{outcome.runs} run(s), expected {expect['runs']}")
    missing = [m for m in expect.get("calls_include", []) if m not in outcome.calls]
    if missing:
        found.append(f"no {missing} call (called: {outcome.calls})")
    if "challenge" in expect and expect["challenge"] not in outcome.body:
        found.append(f"challenge not echoed: {outcome.body[:100]!r}")
    errors = [e for e in outcome.logs if e.get("log_level") in ("error", "critical", "exception")]
    if errors:
        found.append(f"logged errors: {errors}")
    return found


@pytest.mark.parametrize("cases", UNITS, ids=[unit[0]["id"] for unit in UNITS])
def test_each_real_payload_is_handled_as_cases_json_expects(
    replay: Replay, fake_openai: FakeOpenAI, cases: list[dict[str, Any]]
) -> None:
    replay.rt.redis.flushdb()
    replay.slack.reset()
    fake_openai.reset()
    fake_openai.route(lambda body: "Here is what I found.")
    replay.warnings.records.clear()
    first = prepare(cases[0])
    replay.slack.team_id = first.team or "T0001"
    replay.slack.app_id = first.app or "A0001"
    app = build_app(
        replay.rt,
        bot_token=TOKEN,
        signing_secret=SECRET,
        api_url=replay.slack.url,
        listener_threads=1,
    )
    executor = app.listener_runner.listener_executor

    def settle() -> None:  # one listener thread: a no-op queued behind the listeners runs last
        executor.submit(lambda: None).result(timeout=10)

    threads = Threads(replay.rt.redis, replay.rt.settings.namespace)
    found: dict[str, list[str]] = {}
    with serving(app, replay.rt) as server, executor:  # the executor is shut down after
        url = f"http://127.0.0.1:{server.port}/slack/events"
        for case in cases:
            for channel, thread_ts in case.get("seed_threads") or []:
                threads.remember(channel, thread_ts, SEEDED_RUN)
            outcome = deliver(replay, case, url, settle)
            wrong = problems(case, outcome)
            bolt = [r.getMessage()[:200] for r in replay.warnings.records]
            if bolt:
                wrong.append(f"Bolt logged: {bolt}")
            replay.warnings.records.clear()
            if wrong:
                found[case["id"]] = wrong
    assert found == {}
