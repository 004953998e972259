"""Issue 15, item 10, beyond counting runs (tests/test_bot_corpus.py replays the real
payloads): what the bot does with Slackbot, a reply also sent to the channel, payloads no
listener of ours claims, `app_rate_limited`, and the app leaving a workspace.

Before: Slackbot's DM started a run and the bot answered Slackbot; a `thread_broadcast`
reply was ignored; every unclaimed payload got Bolt's 404 "unhandled request" (which
counts toward Slack disabling the event subscription); `app_uninstalled` and
`tokens_revoked` were not handled, so runs went on posting and approvals stayed pending.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from structlog.testing import capture_logs

from approvals import ApprovalStatus
from bot.state.installations import Installations
from bot.transport.serve import build_app
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import (
    app_mention,
    block_actions,
    event_callback,
    form_payload,
    message,
    message_im,
    slash_command,
    view_submission,
)
from tests.support.oauth_server import OAuthMcpServer
from tests.support.redis_server import RedisServer
from tests.support.runtime import make_runtime
from tests.support.slack_bot import ALICE, CHANNEL, SECRET, TOKEN, BotEnv, card_of
from tests.test_connections import TEAM, connect, with_connections
from tests.test_grants import make_grant
from worker.run import EndReason, RunStatus
from worker.service import connections

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN", "body": "down"})])


class BoltRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("slack_bolt"):
            self.messages.append(record.getMessage())


@pytest.fixture
def bolt_warnings() -> Iterator[BoltRecords]:
    handler = BoltRecords()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


# -- people and bots ------------------------------------------------------------------------------


def test_slackbot_is_not_a_person(env: BotEnv) -> None:
    """Slackbot's messages carry no bot_id; its DM would have started a run and been
    answered."""
    env.event(message_im("You have been removed from #general by <@UALICE>", user="USLACKBOT"))
    env.settle()
    assert env.runs() == [] and env.slack.calls("chat.postMessage") == []


def test_a_reply_also_sent_to_the_channel_continues_the_conversation(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("SQL", ["SQL Basics costs $499."])
    model_server.route("Django", ["Django Fundamentals costs $799."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    env.event(mention)
    [first] = env.wait_for_runs(1)
    env.work()
    assert env.rt.store.load(first.id).status == RunStatus.COMPLETED

    reply = message("and Django?", user=ALICE, thread_ts=mention["ts"])
    reply["subtype"] = "thread_broadcast"  # "Also send to #channel"
    env.event(reply)
    runs = env.wait_for_runs(2)
    [second] = [r for r in runs if r.id != first.id]
    assert second.parent_id == first.id and second.question == "and Django?"


# -- payloads no listener claims ------------------------------------------------------------------


def interactive(kind: str, **fields: Any) -> str:
    payload = {
        "type": kind,
        "team": {"id": "T0001", "domain": "fake"},
        "user": {"id": ALICE, "team_id": "T0001"},
        "api_app_id": "A0001",
        "token": "x",
        "trigger_id": "1.2.abc",
        **fields,
    }
    return form_payload(payload)


UNCLAIMED: dict[str, str | dict[str, Any]] = {
    "an event we do not subscribe to": event_callback(
        {"type": "member_joined_channel", "user": ALICE, "channel": CHANNEL}
    ),
    "a button of an older build": block_actions("sb_retired_button", "x", ALICE),
    "another modal": view_submission("someone_elses_modal", user_id=ALICE),
    "a closed modal": interactive(
        "view_closed", view={"id": "V1", "callback_id": "gone", "type": "modal"}
    ),
    "a global shortcut": interactive("shortcut", callback_id="do_a_thing"),
    "a message shortcut": interactive(
        "message_action",
        callback_id="do_a_thing",
        channel={"id": CHANNEL},
        message={"ts": "1700000000.000100", "text": "hi"},
    ),
    "a legacy attachment button": interactive(
        "interactive_message",
        callback_id="old_attachment",
        actions=[{"name": "x", "type": "button", "value": "1"}],
        channel={"id": CHANNEL},
    ),
    "an external select": interactive(
        "block_suggestion", action_id="pick", block_id="b", value="a"
    ),
    "another command": slash_command("/hello-world", "hi", ALICE),
}


@pytest.mark.parametrize("body", UNCLAIMED.values(), ids=UNCLAIMED.keys())
def test_a_payload_no_listener_claims_is_acked_and_logged_never_a_404(
    env: BotEnv, bolt_warnings: BoltRecords, body: Any
) -> None:
    with capture_logs() as logs:
        answer = env.post(body)
        env.settle()
    assert answer.status == 200, answer
    assert bolt_warnings.messages == []  # Bolt's "Unhandled request" warning
    assert {e["event"] for e in logs} & {"event_ignored", "interaction_ignored", "command_ignored"}
    assert env.runs() == []


def test_options_for_an_unknown_select_are_an_empty_list(env: BotEnv) -> None:
    answer = env.post(UNCLAIMED["an external select"])
    assert answer.json() == {"options": []}


def test_app_rate_limited_is_acked_and_warned(env: BotEnv, bolt_warnings: BoltRecords) -> None:
    body = {
        "token": "x",
        "type": "app_rate_limited",
        "team_id": "T0001",
        "minute_rate_limited": 1518467820,
        "api_app_id": "A0001",
    }
    with capture_logs() as logs:
        answer = env.post(body)
    assert answer.status == 200 and bolt_warnings.messages == []
    assert [e["minute"] for e in logs if e["event"] == "slack_events_rate_limited"] == [1518467820]


def test_an_unclaimed_payload_with_a_non_string_id_is_a_400_not_a_500(env: BotEnv) -> None:
    """The catch-alls match ids against a pattern, which raises on anything but a string."""
    for body in (
        interactive("shortcut", callback_id=5),
        interactive("block_suggestion", action_id=["x"], value="a"),
        urlencode({"command": "x", "team_id": "T0001"}).replace("command=x", "command=%00"),
        {"command": 7, "team_id": "T0001", "user_id": ALICE, "channel_id": CHANNEL},
    ):
        answer = env.post(body)
        assert answer.status in (200, 400), (body, answer)


# -- the app leaving a workspace -------------------------------------------------------------------


def gone(kind: str, **event: Any) -> dict[str, Any]:
    body = event_callback({"type": kind, **event})
    body.pop("authorizations")  # as Slack sends these: the installation is already gone
    return body


@pytest.mark.parametrize(
    "event",
    [gone("app_uninstalled"), gone("tokens_revoked", tokens={"oauth": [], "bot": ["UBOT"]})],
    ids=["app_uninstalled", "tokens_revoked"],
)
def test_when_the_app_leaves_a_workspace_its_pending_work_ends_and_nothing_is_posted(
    env: BotEnv, model_server: FakeOpenAI, event: dict[str, Any]
) -> None:
    model_server.route("VPN", [CREATE, "Filed."])
    approval_id, _ = card_of(env, app_mention("<@UBOT> file a VPN ticket", user=ALICE))
    [run] = env.runs()
    posted = len(env.slack.call_log)

    answer = env.post(event)
    assert answer.status == 200
    env.settle()
    request = env.rt.approvals.get(approval_id)
    assert request.status == ApprovalStatus.WITHDRAWN  # at once: nobody can approve it now
    assert env.rt.store.cancel_requested_by(run.id) == event["event"]["type"]

    env.work()
    ended = env.rt.store.load(run.id)
    assert (ended.status, ended.reason) == (RunStatus.PARTIAL, EndReason.CANCELLED)
    assert len(env.slack.call_log) == posted  # no card update, no status, no answer


def test_user_tokens_revoked_alone_change_nothing(env: BotEnv, model_server: FakeOpenAI) -> None:
    model_server.route("VPN", [CREATE, "Filed."])
    approval_id, _ = card_of(env, app_mention("<@UBOT> file a VPN ticket", user=ALICE))
    env.post(gone("tokens_revoked", tokens={"oauth": ["UALICE"], "bot": []}))
    env.settle()
    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING


def test_a_bot_started_with_a_working_token_posts_there_again(
    env: BotEnv, redis_conn: redis.Redis, tmp_path: Path
) -> None:
    env.post(gone("app_uninstalled"))
    env.settle()
    installations = Installations(redis_conn, env.rt.settings.namespace)
    assert installations.revoked("T0001")
    build_app(env.rt, bot_token=TOKEN, signing_secret=SECRET, api_url=env.slack.url)
    assert not installations.revoked("T0001")


def test_a_bot_starting_while_redis_restarts_waits_for_it_instead_of_exiting(
    env: BotEnv, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    conn = redis.Redis.from_url(server.url, socket_timeout=2)
    back = threading.Timer(1.0, server.start)
    try:
        rt = make_runtime(conn, model_server.url)
        installations = Installations(conn, rt.settings.namespace)
        installations.revoke("T0001", "app_uninstalled")
        server.stop()  # Redis goes away as the bot starts, and is back a moment later
        back.start()
        with capture_logs() as logs:
            build_app(rt, bot_token=TOKEN, signing_secret=SECRET, api_url=env.slack.url)
        back.join()
        assert "redis_unavailable_at_start" in [entry["event"] for entry in logs]
        assert not installations.revoked("T0001")
    finally:
        back.cancel()  # a failure before the restart: never start it after the test
        if back.ident is not None:
            back.join()
        conn.close()
        server.stop()


# -- a person deactivated --------------------------------------------------------------------------


def test_a_deactivated_person_loses_their_connections_and_standing_grants(
    env: BotEnv, provider_server: OAuthMcpServer
) -> None:
    with_connections(env.rt, provider_server)
    for user in ("UALICE", "UBOB"):
        connections.confirm(env.rt, TEAM, user, connect(env.rt, user).code)

    def grant(requester: str, grantor: str, team: str = TEAM) -> str:
        return make_grant(
            env.rt.grants, requester=requester, grantor=grantor, team_id=team, grantor_team=team
        ).id

    covers_alice = grant(requester="UALICE", grantor="UCAROL")
    given_by_alice = grant(requester="UDAVE", grantor="UALICE")
    bobs = grant(requester="UBOB", grantor="UCAROL")
    elsewhere = grant(requester="UALICE", grantor="UCAROL", team="T0002")

    env.event({"type": "user_change", "user": {"id": "UALICE", "team_id": TEAM, "deleted": False}})
    env.settle()
    assert [c.provider for c in connections.listing(env.rt, TEAM, "UALICE")] == ["mcp:people"]

    env.event({"type": "user_change", "user": {"id": "UALICE", "team_id": TEAM, "deleted": True}})
    env.settle()
    assert connections.listing(env.rt, TEAM, "UALICE") == []
    assert [c.provider for c in connections.listing(env.rt, TEAM, "UBOB")] == ["mcp:people"]
    live = {g.id for g in env.rt.grants.live()}
    assert covers_alice not in live and given_by_alice not in live
    assert {bobs, elsewhere} <= live  # another person's, the same id in another workspace
