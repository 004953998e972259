"""Socket Mode end to end, as `switchboard dev` meets Slack: bot.transport.serve's
TimedSocketModeHandler (Bolt's handler on slack_sdk's builtin SocketModeClient) gets its URL
from `apps.connections.open` on FakeSlack and talks over a real WebSocket to SocketGateway,
a local stand-in of Slack's gateway. The rest is real too: Redis, the RQ worker run
in-process, FakeOpenAI for the model, SQLite tickets."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from cryptography.fernet import Fernet
from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from structlog.testing import capture_logs

from approvals import ApprovalStatus
from bot.outbound.slack_surface import SlackSurface
from bot.render.blocks import APPROVE, VIEW_RUN
from bot.transport.oauth_callback import CALLBACK_PATH
from bot.transport.serve import (
    CallbackPortError,
    TimedSocketModeHandler,
    build_app,
    serve_callback,
)
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_events import TEAM_ID
from tests.fakes.slack_server import (
    FakeSlack,
    app_mention,
    block_actions,
    event_callback,
    send_signed,
    slash_command,
)
from tests.fakes.socket_gateway import Ack, SocketGateway
from tests.support.oauth_server import OAuthMcpServer
from tests.support.processes import worker_env
from tests.support.runtime import make_runtime, wait_until, work
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    POLICY,
    SECRET,
    STRANGER,
    SUPPORT,
    TOKEN,
    USERGROUPS,
    buttons,
    has_button,
    texts,
)
from tools.builtin.tickets import TicketStore
from worker.connections import ConnectionStore
from worker.connections.providers import read_providers
from worker.connections.tokens import Connections
from worker.run import Run, RunStatus
from worker.runtime import Runtime
from worker.service import connections

APP_TOKEN = "xapp-1-A0001-1-test"
ACK_WITHIN = 3.0  # Slack's deadline for an acknowledgement

CREATE = Turn(
    tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down", "body": "since 9am"})]
)


@dataclass
class SocketEnv:
    rt: Runtime
    slack: FakeSlack
    gateway: SocketGateway
    app: App
    handler: TimedSocketModeHandler

    def acked(self, envelope_id: str, count: int = 1) -> Ack:
        """The envelope's `count`-th ack, which must have come within Slack's 3 s."""
        ack = self.gateway.wait_for_ack(envelope_id, count)
        assert ack.seconds is not None and ack.seconds < ACK_WITHIN, ack
        return ack

    def mention(self, event: dict[str, Any], **options: Any) -> Ack:
        return self.acked(self.gateway.push_event(event_callback(event), **options))

    def settle(self) -> None:
        """Wait until every listener started so far has finished (as BotEnv.settle)."""
        executor = self.app.listener_runner.listener_executor
        size = executor._max_workers  # type: ignore[attr-defined]
        barrier = threading.Barrier(size)
        for done in [executor.submit(barrier.wait, 10) for _ in range(size)]:
            done.result(timeout=15)

    def work(self) -> None:
        self.settle()
        work(self.rt)

    def runs(self) -> list[Run]:
        return self.rt.store.recent(limit=100)

    def wait_for_runs(self, count: int) -> list[Run]:
        return wait_until(lambda: len(runs := self.runs()) >= count and runs, what=f"{count} runs")


@pytest.fixture
def socket_env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[SocketEnv]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy_file)
    with FakeSlack(usergroups=USERGROUPS) as slack:  # it owns the gateway, and stops it
        surface = SlackSurface(WebClient(token=TOKEN, base_url=slack.url), rt, update_interval=0.2)
        rt.surfaces["slack"] = surface
        app = build_app(rt, bot_token=TOKEN, signing_secret=SECRET, api_url=slack.url)
        handler = TimedSocketModeHandler(app, APP_TOKEN)
        try:
            handler.connect()  # what serve()'s blocking start() does first
            slack.gateway.wait_for_connections(1)
            yield SocketEnv(rt, slack, slack.gateway, app, handler)
        finally:
            close(handler, slack.gateway)
            surface.close()


def close(handler: TimedSocketModeHandler, gateway: SocketGateway) -> None:
    """Close the handler without waiting out its receive timeout: slack_sdk's client closes
    a connection under the lock its reader holds while blocked in recv() (up to 3 s), so
    the gateway hangs up first (and the client must not reconnect)."""
    handler.client.auto_reconnect_enabled = False
    gateway.drop()
    handler.close()


def test_the_handler_connects_with_the_app_token_and_gets_hello(socket_env: SocketEnv) -> None:
    [opened] = socket_env.slack.call_log[-1:]
    assert opened.method == "apps.connections.open"
    assert opened.headers["authorization"] == f"Bearer {APP_TOKEN}"
    assert socket_env.gateway.connections == 1 and socket_env.gateway.refused == 0
    assert socket_env.handler.client.is_connected()
    # the client pings at once, and the gateway's pongs keep it from calling the link stale
    socket_env.gateway.wait_for(lambda: socket_env.gateway.pings >= 1)


def test_a_mention_is_acked_and_answered_in_its_thread(
    socket_env: SocketEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("weather", ["It is sunny in Lisbon."])
    mention = app_mention("<@UBOT> what is the weather in Lisbon?", user=ALICE)

    ack = socket_env.mention(mention)

    assert ack.payload is None  # Events API envelopes get a bare ack
    [run] = socket_env.wait_for_runs(1)
    assert run.question == "what is the weather in Lisbon?"
    assert (run.requester.user_id, run.requester.channel_id) == (ALICE, CHANNEL)
    socket_env.work()
    answer = socket_env.slack.wait_for_call(
        "chat.postMessage",
        lambda a: a.get("thread_ts") == mention["ts"] and VIEW_RUN in buttons(a.get("blocks", [])),
    )
    assert "It is sunny in Lisbon." in texts(answer["blocks"])
    assert socket_env.rt.store.load(run.id).status == RunStatus.COMPLETED


def test_an_approval_click_runs_the_write_once(
    socket_env: SocketEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("VPN", [CREATE, "I filed ticket #1 for the VPN outage."])
    mention = app_mention("<@UBOT> please file a ticket: VPN is down", user=ALICE)
    socket_env.mention(mention)
    [run] = socket_env.wait_for_runs(1)
    socket_env.work()
    card = socket_env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
    approval_id = buttons(card["blocks"])[APPROVE]
    [stored] = socket_env.rt.approvals.get(approval_id).cards
    click = {"channel": CHANNEL, "message_ts": stored["ts"], "thread_ts": mention["ts"]}

    refused = socket_env.gateway.push_interactive(
        block_actions(APPROVE, approval_id, user_id=STRANGER, **click)
    )
    assert socket_env.acked(refused).payload is None
    socket_env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == STRANGER)
    assert socket_env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING

    approved = socket_env.gateway.push_interactive(
        block_actions(APPROVE, approval_id, user_id=SUPPORT, **click)
    )
    socket_env.acked(approved)
    socket_env.slack.wait_for_call(
        "chat.update",
        lambda a: a["ts"] == stored["ts"] and "Approved by <@USUPPORT>" in texts(a),
    )
    socket_env.work()
    answer = socket_env.slack.wait_for_message(
        CHANNEL,
        lambda m: m.get("thread_ts") == mention["ts"] and VIEW_RUN in buttons(m.get("blocks", [])),
    )
    assert "I filed ticket #1 for the VPN outage." in texts(answer["blocks"])
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
    assert socket_env.rt.store.load(run.id).status == RunStatus.COMPLETED


def test_a_slash_command_gets_its_ack_and_its_answer(socket_env: SocketEnv) -> None:
    envelope_id = socket_env.gateway.push_command(
        slash_command("/switchboard", "help", user_id=ALICE, channel_id=CHANNEL)
    )

    assert socket_env.acked(envelope_id).payload is None
    help_text = socket_env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == ALICE)
    assert help_text["channel"] == CHANNEL and "/switchboard" in help_text["text"]

    # another app's command: the answer travels in the ack (accepts_response_payload)
    other = socket_env.gateway.push_command(slash_command("/hello-world", "hi", user_id=ALICE))
    ack = socket_env.acked(other)
    assert ack.payload is not None and "/hello-world" in ack.payload["text"]


def test_after_a_disconnect_the_client_reconnects_and_a_retry_makes_no_second_run(
    socket_env: SocketEnv,
) -> None:
    gateway, slack = socket_env.gateway, socket_env.slack
    socket_env.mention(app_mention("<@UBOT> first question", user=ALICE))
    socket_env.wait_for_runs(1)

    assert gateway.disconnect() == 1  # Slack refreshes a connection every few hours
    gateway.wait_for_connections(2)
    assert len(slack.calls("apps.connections.open")) == 2  # a new URL: tickets are one-use
    # The client closes the old connection once the new one is up, and reads the new one
    # only then. That close waits for the old connection's reader, blocked in recv() for
    # up to slack_sdk's 3 s receive timeout: an envelope sent in that window is acked after
    # about 3 s (measured 3.06 s), which Slack counts as late. So wait for the close here.
    gateway.wait_for(lambda: gateway.open_connections == 1)

    body = event_callback(app_mention("<@UBOT> second question", user=ALICE))
    envelope_id = gateway.push_event(body)
    ack = socket_env.acked(envelope_id)
    assert ack.connection == 2
    socket_env.wait_for_runs(2)

    with capture_logs() as logs:  # Slack redelivers what it thinks was not acked in time
        socket_env.acked(
            gateway.push_event(body, retry_attempt=1, retry_reason="timeout"),
        )
        socket_env.settle()
    assert len(socket_env.runs()) == 2
    repeated = [e for e in logs if e["event"] == "event_repeated"]
    assert [(e["event_id"], e["retry"]) for e in repeated] == [(body["event_id"], "1")]
    assert gateway.refused == 0


def test_the_same_envelope_delivered_twice_makes_one_run(socket_env: SocketEnv) -> None:
    body = event_callback(app_mention("<@UBOT> only once please", user=ALICE))
    envelope_id = socket_env.gateway.push_event(body)
    socket_env.acked(envelope_id)
    socket_env.gateway.push_event(body, envelope_id=envelope_id, retry_attempt=1)
    socket_env.acked(envelope_id, count=2)
    socket_env.settle()
    [run] = socket_env.runs()
    assert run.question == "only once please"


def test_apps_connections_open_takes_only_an_app_token() -> None:
    with FakeSlack(tokens={TOKEN, APP_TOKEN}) as slack:
        for token, error in [
            (TOKEN, "not_allowed_token_type"),  # the bot token, as a misconfigured app would
            ("xapp-unknown", "invalid_auth"),
        ]:
            with pytest.raises(SlackApiError) as refused:
                WebClient(base_url=slack.url).apps_connections_open(app_token=token)
            assert refused.value.response["error"] == error
        with pytest.raises(SlackApiError) as missing:
            WebClient(base_url=slack.url).api_call("apps.connections.open")
        assert missing.value.response["error"] == "not_authed"
        # and the app token is good for nothing else
        with pytest.raises(SlackApiError) as misused:
            WebClient(token=APP_TOKEN, base_url=slack.url).auth_test()
        assert misused.value.response["error"] == "not_allowed_token_type"
        opened = WebClient(base_url=slack.url).apps_connections_open(app_token=APP_TOKEN)
        assert str(opened["url"]).startswith(f"ws://127.0.0.1:{slack.gateway.port}/link/?ticket=")


def test_socket_mode_with_the_bot_token_does_not_connect(socket_env: SocketEnv) -> None:
    handler = TimedSocketModeHandler(socket_env.app, TOKEN)
    try:
        with pytest.raises(SlackApiError) as refused:
            handler.connect()
    finally:
        handler.close()
    assert refused.value.response["error"] == "not_allowed_token_type"
    assert socket_env.gateway.connections == 1  # only the fixture's own


# -- Socket Mode with per-user connections: the one HTTP path people's browsers need ----------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    """The port takes connections and answers (any status)."""
    try:
        httpx2.get(url, timeout=2)
    except httpx2.HTTPError:
        return False
    return True


def registered_client(server: OAuthMcpServer, redirect_uri: str) -> dict[str, Any]:
    """An OAuth app registered at the provider, as an operator registers a GitHub app."""
    answer = httpx2.post(
        server.base + "/register",
        json={
            "redirect_uris": [redirect_uri],
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "client_name": "Switchboard",
        },
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


PEOPLE = """\
providers:
  people:
    label: People
    authorize_url: {base}/authorize
    token_url: {base}/token
    client_id: ${{PEOPLE_CLIENT_ID}}
    client_secret: ${{PEOPLE_CLIENT_SECRET}}
"""


@pytest.mark.slow
def test_socket_mode_with_connections_serves_the_oauth_callback_and_no_other_path(
    redis_url: str,
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    tmp_path: Path,
) -> None:
    """`switchboard bot` (Socket Mode) as an operator runs it with connections set up: it
    connects to the gateway, and the port SWITCHBOARD_PUBLIC_URL names finishes a real flow;
    /slack/events and everything else there is 404."""
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    client = registered_client(provider_server, public + CALLBACK_PATH)
    providers = tmp_path / "providers.yaml"
    providers.write_text(PEOPLE.format(base=provider_server.base))
    key = Fernet.generate_key().decode()
    secrets_env = {
        "PEOPLE_CLIENT_ID": client["client_id"],
        "PEOPLE_CLIENT_SECRET": client["client_secret"],
    }
    (tmp_path / "data").mkdir()
    with FakeSlack(tokens={TOKEN, APP_TOKEN}) as slack:
        env = worker_env(
            redis_url,
            model_server.url,
            tmp_path,
            SLACK_BOT_TOKEN=TOKEN,
            SLACK_APP_TOKEN=APP_TOKEN,
            SLACK_API_URL=slack.url,
            SWITCHBOARD_CONNECTION_KEYS=key,
            SWITCHBOARD_PUBLIC_URL=public,
            SWITCHBOARD_OAUTH_PROVIDERS=str(providers),
            **secrets_env,
        )
        command = [sys.executable, "-m", "switchboard", "bot", "--port", str(port)]
        with subprocess.Popen(
            command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
        ) as bot:
            try:
                slack.gateway.wait_for_connections(1, timeout=60)
                wait_until(lambda: answers(public + "/"), timeout=30, what="the callback port")
                # Socket Mode is what takes Slack's requests
                envelope = slack.gateway.push_command(
                    slash_command("/switchboard", "help", user_id=ALICE, channel_id=CHANNEL)
                )
                assert slack.gateway.wait_for_ack(envelope, timeout=15).seconds is not None

                # this process starts Alice's flow; the bot's port finishes it
                rt = make_runtime(redis_conn, model_server.url)
                store = ConnectionStore(redis_conn, rt.settings.namespace, [key])
                found = read_providers(providers.read_text(), "providers.yaml", secrets_env)
                rt.connections = Connections(store, found, public)
                url = connections.connect_url(rt, TEAM_ID, ALICE, "people")
                with httpx2.Client(follow_redirects=True, timeout=10) as browser:
                    login = browser.get(url)
                    back = browser.get(str(login.url) + "&user=alice")
                    assert str(back.url).startswith(public + CALLBACK_PATH + "?")
                    assert back.status_code == 200 and back.headers["cache-control"] == "no-store"
                    code = back.text.split("<code>")[1].split("</code>")[0]
                    replay = browser.get(back.url)
                assert replay.status_code == 400 and "already used" in replay.text
                connections.confirm(rt, TEAM_ID, ALICE, code)
                token = connections.token_for(rt, TEAM_ID, ALICE, "people")
                assert provider_server.people.access[token].subject == "alice"

                events = send_signed(
                    public + "/slack/events", SECRET, event_callback(app_mention("hi"))
                )
                others = [httpx2.get(public + p, timeout=5) for p in ("/metrics", "/livez", "/")]
                assert [events.status, *(o.status_code for o in others)] == [404, 404, 404, 404]
                bot.send_signal(signal.SIGTERM)
                _, err = bot.communicate(timeout=30)
            finally:
                if bot.poll() is None:
                    bot.kill()
    assert bot.returncode == 0, err
    assert "oauth_callback_serving" in err and "Traceback" not in err, err
    assert code not in err and token not in err  # nothing secret in the bot's log
    assert not answers(public + "/")  # the port closed with the bot


def test_socket_mode_without_connections_opens_no_port_and_a_taken_one_says_so(
    redis_conn: redis.Redis,
) -> None:
    rt = make_runtime(redis_conn, "http://127.0.0.1:9/v1")
    assert rt.connections is None and serve_callback(rt, ("127.0.0.1", 0)) is None
    store = ConnectionStore(redis_conn, rt.settings.namespace, [Fernet.generate_key().decode()])
    rt.connections = Connections(store, {}, "http://127.0.0.1:1")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(CallbackPortError, match=f"/oauth/callback on port {port}.*--port"):
            serve_callback(rt, ("127.0.0.1", port))
