"""The Slack bot under test: the real Bolt app behind bot.transport.serve's HTTP server on a local
port, FakeSlack as the Web API, a real runtime (Redis, RQ SimpleWorker, FakeOpenAI)."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import redis
import structlog
from slack_bolt import App
from slack_sdk import WebClient

from bot.outbound.slack_surface import SlackSurface
from bot.render.blocks import APPROVE
from bot.state.identity import GROUPS_TTL
from bot.transport.serve import LISTENER_THREADS, SlackHTTPServer, build_app
from tests.fakes.slack_server import (
    FakeSlack,
    SignedResponse,
    block_actions,
    event_callback,
    form_payload,
    send_signed,
    slash_command,
)
from tests.support.runtime import make_runtime, wait_until, work
from worker.run import Run
from worker.runtime import Runtime

SECRET = "test-signing-secret"
TOKEN = "xoxb-test"
CHANNEL = "C0001"

ALICE = "UALICE"  # asks
SUPPORT = "USUPPORT"  # may approve tickets (through the @support-team user group)
SUPPORT2 = "USUPPORT2"
ADMIN = "UADMIN"
STRANGER = "USTRANGER"

POLICY = """\
roles:
  admins: [UADMIN]
  support: ["@support-team"]
admins: [admins]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support]
    self_approval: false
# grant the tools this file does not name, as when there is no policy file
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""

USERGROUPS: list[dict[str, Any]] = [
    {"id": "S0SUPPORT", "handle": "support-team", "users": [SUPPORT, SUPPORT2]}
]


@dataclass
class BotEnv:
    rt: Runtime
    slack: FakeSlack
    server: SlackHTTPServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/slack/events"

    def post(self, body: str | Mapping[str, Any], **kwargs: Any) -> SignedResponse:
        return send_signed(self.url, SECRET, body, **kwargs)

    def event(
        self, event: Mapping[str, Any], *, event_id: str | None = None, **kwargs: Any
    ) -> SignedResponse:
        response = self.post(event_callback(event, event_id), **kwargs)
        assert response.status == 200, response
        return response

    def click(self, action_id: str, value: str, user: str, **kwargs: Any) -> SignedResponse:
        response = self.post(block_actions(action_id, value, user_id=user, **kwargs))
        assert response.status == 200, response
        return response

    def command(self, text: str, user: str, channel: str = CHANNEL) -> SignedResponse:
        response = self.post(slash_command("/switchboard", text, user_id=user, channel_id=channel))
        assert response.status == 200, response
        return response

    def work(self) -> None:
        """Run the queued jobs, once every listener started so far is done (a listener
        queues its run's job after the run exists: working at once could find no job)."""
        self.settle()
        work(self.rt)

    def settle(self) -> None:
        """Wait until every listener started so far has finished: one task per listener
        thread, all waiting for each other, can only all run once nothing else does."""
        executor = self.server.app.listener_runner.listener_executor
        size = executor._max_workers  # type: ignore[attr-defined]
        barrier = threading.Barrier(size)
        for done in [executor.submit(barrier.wait, 10) for _ in range(size)]:
            done.result(timeout=15)

    def runs(self) -> list[Run]:
        return self.rt.store.recent(limit=100)

    def wait_for_runs(self, count: int) -> list[Run]:
        def enough() -> list[Run]:
            runs = self.runs()
            return runs if len(runs) >= count else []

        return wait_until(enough, what=f"{count} run(s)")


@contextmanager
def bot_env(
    conn: redis.Redis,
    model_url: str,
    tmp_path: Path,
    *,
    policy: str = POLICY,
    listener_threads: int = LISTENER_THREADS,
    allowed_teams: tuple[str, ...] = (),
    allowed_apps: tuple[str, ...] = (),
    groups_ttl: float = GROUPS_TTL,
    signing_secrets: tuple[str, ...] = (SECRET,),
    **server_options: Any,
) -> Iterator[BotEnv]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy)
    rt = make_runtime(conn, model_url, policy_file=policy_file)
    with FakeSlack(usergroups=USERGROUPS) as slack:
        client = WebClient(token=TOKEN, base_url=slack.url)
        surface = SlackSurface(client, rt, update_interval=0.2)
        rt.surfaces["slack"] = surface
        app = build_app(
            rt,
            bot_token=TOKEN,
            signing_secret=signing_secrets,
            api_url=slack.url,
            listener_threads=listener_threads,
            allowed_teams=allowed_teams,
            allowed_apps=allowed_apps,
            groups_ttl=groups_ttl,
        )
        try:
            with serving(app, rt, signing_secret=signing_secrets, **server_options) as server:
                yield BotEnv(rt, slack, server)
        finally:
            surface.close()


def fresh_logging() -> None:
    """structlog's defaults again: a test that ran the CLI in this process left it
    configured for a terminal (switchboard.logs: WARNING and up, loggers cached on first
    use), and `capture_logs` would see nothing the bot logs at info."""
    structlog.reset_defaults()


@contextmanager
def serving(app: App, rt: Runtime, **options: Any) -> Iterator[SlackHTTPServer]:
    """bot.transport.serve's HTTP server for `app` on a free local port, in a thread."""
    options.setdefault("signing_secret", SECRET)
    server = SlackHTTPServer(app, rt, ("127.0.0.1", 0), **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# -- reading what the bot posted ------------------------------------------------------------------


def texts(blocks: Any) -> str:
    """All text in a block structure, joined: what a reader would see."""
    if isinstance(blocks, dict):
        own = blocks["text"] if isinstance(blocks.get("text"), str) else ""
        return " ".join([own, *(texts(v) for v in blocks.values())]).strip()
    if isinstance(blocks, list):
        return " ".join(texts(b) for b in blocks).strip()
    return ""


def buttons(blocks: list[dict[str, Any]]) -> dict[str, str]:
    """action_id -> value of every button in the blocks."""
    found: dict[str, str] = {}
    for block in blocks:
        elements = list(block.get("elements") or [])
        if block.get("accessory"):
            elements.append(block["accessory"])
        for element in elements:
            if element.get("type") == "button":
                found[element["action_id"]] = element.get("value", "")
    return found


def has_button(action_id: str) -> Any:
    return lambda args: action_id in buttons(args.get("blocks") or [])


def answered(env: BotEnv, method: str, send: Callable[[], object]) -> dict[str, Any]:
    """Send, then wait for the next `method` call the bot makes."""
    before = len(env.slack.calls(method))
    send()
    return env.slack.wait_for(
        lambda: env.slack.calls(method)[before] if len(env.slack.calls(method)) > before else None
    )


def shown_view(slack: FakeSlack, action_id: str, value: str) -> dict[str, Any]:
    """The modal FakeSlack holds (with its id, as Slack sends it back in a click) that has
    the button `action_id` with `value`. FakeSlack numbers views V00000001, V00000002, ..."""
    for n in itertools.count(1):
        view = slack.view(f"V{n:08d}")
        if view is None:
            raise AssertionError(f"no view with a {action_id} button for {value}")
        if buttons(view["blocks"]).get(action_id) == value:
            return view
    raise AssertionError("unreachable")


def card_of(env: BotEnv, mention: dict[str, Any]) -> tuple[str, str]:
    """Send `mention`, run the worker until the run waits: (approval id, card ts)."""
    before = len(env.runs())
    env.event(mention)
    env.wait_for_runs(before + 1)
    env.work()
    card = env.slack.wait_for_call(
        "chat.postMessage",
        lambda a: APPROVE in buttons(a.get("blocks") or []) and a["thread_ts"] == mention["ts"],
    )
    approval_id = buttons(card["blocks"])[APPROVE]
    [stored] = env.rt.approvals.get(approval_id).cards
    return approval_id, stored["ts"]


def from_team(form_body: str, user_team: str) -> str:
    """A click or modal form body as sent for a person whose own team is `user_team`
    (Slack Connect), in the workspace the payload was sent for."""
    payload = json.loads(dict(parse_qsl(form_body))["payload"])
    payload["user"]["team_id"] = user_team
    return form_payload(payload)
