"""Issue 15, item 4: requests for another workspace or another app are refused unless
configured; a person from another organisation (Slack Connect) gets the role `external`,
which by default may start nothing and decide nothing; the run's requester carries the
person's own team, not the workspace's.

Before: every signed request was served whatever its team or app; an external person got
`everyone` (so asked, and approved their own writes where self-approval is allowed), and
the run recorded the host workspace as their team.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from structlog.testing import capture_logs

from approvals import ApprovalStatus
from bot.render import messages as m
from bot.render.blocks import APPROVE
from bot.state.identity import EXTERNAL
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import (
    app_mention,
    block_actions,
    event_callback,
    message,
    next_ts,
    slash_command,
)
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    STRANGER,
    SUPPORT,
    BotEnv,
    bot_env,
    card_of,
    from_team,
    texts,
)
from worker.run import RunStatus

OUTSIDER = "UOUTSIDER"  # a Slack Connect guest from another organisation
THEIR_TEAM = "T0THEIRS"
OTHER_WORKSPACE = "T0OTHER"
CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN", "body": "down"})])

# `external` (a built-in role) is named, so external people may ask; create_ticket may be
# approved by anyone in the workspace, and by its requester
OPEN_POLICY = """\
roles:
  admins: [UADMIN]
admins: [admins]
tools:
  create_ticket:
    allow: [everyone, external]
    approvers: [requester, everyone]
    self_approval: true
defaults:
  read: {allow: [everyone]}
"""


def outsider_mention(text: str, ts: str | None = None) -> dict[str, Any]:
    event = app_mention(f"<@UBOT> {text}", user=OUTSIDER, ts=ts)
    event["user_team"] = THEIR_TEAM  # what Slack sends for a Slack Connect user
    event["team"] = THEIR_TEAM
    return event


# -- another workspace, another app ---------------------------------------------------------------


def test_a_request_for_another_workspace_is_acked_and_dropped(env: BotEnv) -> None:
    before = len(env.slack.call_log)
    with capture_logs() as logs:
        mention = app_mention("<@UBOT> hi", user=ALICE, team_id=OTHER_WORKSPACE)
        env.post(event_callback(mention, team_id=OTHER_WORKSPACE))
        env.post(block_actions(APPROVE, "ap_0123456789abcdef", ALICE, team_id=OTHER_WORKSPACE))
        command = env.post(slash_command("/switchboard", "help", ALICE, team_id=OTHER_WORKSPACE))
        env.settle()
    assert command.status == 200 and command.body == ""
    assert env.runs() == [] and env.rt.queue.count == 0
    assert len(env.slack.call_log) == before  # nothing posted, nobody looked up
    refused = [e for e in logs if e["event"] == "request_refused"]
    assert len(refused) == 3 and {e["why"] for e in refused} == {"another team"}


def test_a_request_for_another_app_is_acked_and_dropped(env: BotEnv) -> None:
    with capture_logs() as logs:
        env.post(event_callback(app_mention("<@UBOT> hi", user=ALICE), api_app_id="A0OTHER"))
        env.settle()
    assert env.runs() == []
    assert [e["why"] for e in logs if e["event"] == "request_refused"] == ["another app"]


def test_a_workspace_that_is_configured_is_served(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    with bot_env(redis_conn, model_server.url, tmp_path, allowed_teams=(OTHER_WORKSPACE,)) as env:
        env.post(event_callback(app_mention("<@UBOT> hi", user=ALICE), team_id=OTHER_WORKSPACE))
        [run] = env.wait_for_runs(1)
        assert run.origin["team"] == OTHER_WORKSPACE


# -- people from other organisations --------------------------------------------------------------


def test_an_external_person_may_start_nothing_by_default(env: BotEnv) -> None:
    mention = outsider_mention("what does SQL Basics cost?")
    env.event(mention)
    said = env.slack.wait_for_call("chat.postMessage", lambda a: a["thread_ts"] == mention["ts"])
    assert said["text"] == m.EXTERNAL_CANNOT_ASK
    assert env.runs() == [] and env.rt.queue.count == 0

    # a reply in a thread the bot answered in is overheard, not addressed: no answer at all
    env.rt.redis.set(f"sb:slack:thread:{CHANNEL}:{mention['ts']}", "r00000000000000aa")
    reply = message("and Django?", user=OUTSIDER, thread_ts=mention["ts"])
    reply["user_team"] = THEIR_TEAM
    env.event(reply)
    env.settle()
    assert len(env.slack.calls("chat.postMessage")) == 1 and env.runs() == []


def test_an_external_person_may_decide_nothing_by_default(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """create_ticket may be approved by everyone here: everyone in the workspace."""
    model_server.route("VPN", [CREATE, "Filed."])
    with bot_env(redis_conn, model_server.url, tmp_path, policy=OPEN_POLICY) as env:
        mention = app_mention("<@UBOT> file a ticket: VPN is down", user=ALICE)
        approval_id, card_ts = card_of(env, mention)

        click = block_actions(APPROVE, approval_id, OUTSIDER, message_ts=card_ts)
        env.post(from_team(click, THEIR_TEAM))
        refusal = env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == OUTSIDER)
        assert "can't decide" in refusal["text"]
        assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING
        [run] = env.runs()
        events = [e.kind for e in env.rt.events.read(run.id)]
        assert "decision_refused" in events

        env.click(APPROVE, approval_id, STRANGER, message_ts=card_ts)  # anyone inside may
        env.slack.wait_for_call("chat.update", lambda a: "Approved by <@USTRANGER>" in texts(a))


def test_an_external_asker_carries_their_own_team_and_may_not_approve_their_own_write(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """Where the policy names `external`, an outsider may ask; the run (and so every tool's
    ToolContext) has their own team and only the `external` role, and self-approval, which
    the policy allows, is not enough for them."""
    model_server.route("VPN", [CREATE, "Filed."])
    with bot_env(redis_conn, model_server.url, tmp_path, policy=OPEN_POLICY) as env:
        mention = outsider_mention("file a ticket: VPN is down", ts=next_ts())
        approval_id, card_ts = card_of(env, mention)
        [run] = env.runs()
        assert run.requester.team_id == THEIR_TEAM
        assert run.requester.roles == [EXTERNAL]
        assert run.origin["team"] == "T0001"  # the workspace it was asked in

        click = block_actions(APPROVE, approval_id, OUTSIDER, message_ts=card_ts)
        env.post(from_team(click, THEIR_TEAM))
        env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == OUTSIDER)
        assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING

        env.click(APPROVE, approval_id, SUPPORT, message_ts=card_ts)
        env.work()
        assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
