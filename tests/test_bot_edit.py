"""Approve with edits and reject with instructions, end to end over signed HTTP: the real
Bolt app, FakeSlack, FakeOpenAI, a real Redis and RQ worker, SQLite tickets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from approvals import ApprovalStatus
from bot.render.blocks import APPROVE, EDIT, EDIT_MODAL, REJECT, REJECT_MODAL
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import view_submission
from tests.support.runtime import tool_messages
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    STRANGER,
    SUPPORT,
    BotEnv,
    bot_env,
    buttons,
    texts,
)
from tests.test_bot_flow import CREATE, suspended_on_card
from tools.builtin.tickets import TicketStore
from worker.run import RunStatus

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
    high_risk: true
    constraints:
      project: [IT, HR]
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""


@pytest.fixture
def edit_env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY) as bot:
        yield bot


def block_of(view: dict[str, Any], label: str) -> dict[str, Any]:
    return next(b for b in view["blocks"] if b.get("label", {}).get("text") == label)


def form(view: dict[str, Any], **changed: dict[str, Any]) -> dict[str, Any]:
    """view.state.values as Slack sends them: every input as the modal prefilled it, with
    the `changed` states (by label) in their place."""
    values: dict[str, Any] = {}
    for block in view["blocks"]:
        if block["type"] != "input":
            continue
        element = block["element"]
        if element["type"] == "static_select":
            state = {"type": "static_select", "selected_option": element.get("initial_option")}
        else:
            state = {"type": element["type"], "value": element.get("initial_value")}
        values[block["block_id"]] = {
            element["action_id"]: changed.get(block["label"]["text"], state)
        }
    return values


def text(value: str) -> dict[str, Any]:
    return {"type": "plain_text_input", "value": value}


def submit(env: BotEnv, view: dict[str, Any], user: str, values: dict[str, Any]) -> Any:
    response = env.post(
        view_submission(EDIT_MODAL, values, user_id=user, private_metadata=view["private_metadata"])
    )
    assert response.status == 200
    return response.json()


def test_an_edit_is_checked_in_the_modal_and_exactly_the_edited_call_runs_once(
    edit_env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = edit_env
    model_server.route("VPN", [CREATE, "I filed the ticket as edited."])
    mention, approval_id, card_ts = suspended_on_card(env)
    card = env.slack.message(CHANNEL, card_ts)
    assert card is not None and buttons(card["blocks"])[EDIT] == approval_id

    env.click(EDIT, approval_id, STRANGER, channel=CHANNEL, message_ts=card_ts)
    env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == STRANGER)
    assert env.slack.calls("views.open") == []

    env.click(
        EDIT, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts, thread_ts=mention["ts"]
    )
    view = env.slack.wait_for_call("views.open")["view"]
    assert view["callback_id"] == EDIT_MODAL
    assert "high-risk" in texts(view["blocks"])  # the modal is the confirmation
    assert block_of(view, "title")["element"]["initial_value"] == "VPN is down"
    assert block_of(view, "priority")["element"]["type"] == "static_select"
    project_block = block_of(view, "project")["block_id"]
    title_block = block_of(view, "title")["block_id"]

    # a project the policy does not allow: refused in the modal, naming the field
    refused = submit(env, view, SUPPORT, form(view, project=text("FINANCE")))
    assert refused["response_action"] == "errors"
    assert list(refused["errors"]) == [project_block]
    assert "IT, HR" in refused["errors"][project_block]
    # a title the schema does not allow
    refused = submit(env, view, SUPPORT, form(view, title=text("x" * 201)))
    assert list(refused["errors"]) == [title_block]
    # the requester may not approve her own call, edited or not
    refused = submit(env, view, ALICE, form(view, title=text("VPN down in Berlin")))
    assert "@support" in next(iter(refused["errors"].values()))
    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING

    high = {"type": "static_select", "selected_option": {"value": "2"}}  # "high"
    edited = form(view, title=text("VPN down in Berlin"), priority=high)
    assert submit(env, view, SUPPORT, edited) is None  # accepted: the modal closes
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Approved with edits" in texts(a)
    )
    shown = texts(updated["blocks"])
    assert "<@USUPPORT>" in shown and "VPN is down" in shown and "VPN down in Berlin" in shown
    assert APPROVE not in buttons(updated["blocks"]) and EDIT not in buttons(updated["blocks"])
    # the same form again decides nothing
    again = submit(env, view, SUPPORT, edited)
    assert "Approved with edits" in next(iter(again["errors"].values()))

    env.work()
    [run] = env.runs()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    store = TicketStore(tickets_db)
    assert store.count_executions("create_ticket") == 1
    ticket = store.get(1)
    assert ticket is not None
    assert (ticket["title"], ticket["priority"]) == ("VPN down in Berlin", "high")
    [observation] = tool_messages(model_server.last_chat_request)
    assert "Approved with edits by <@USUPPORT>" in observation
    assert 'title: "VPN is down" -> "VPN down in Berlin"' in observation
    events = env.rt.events.read(run.id)
    [decided] = [e for e in events if e.kind == "approval_decided"]
    assert decided.data["by"] == SUPPORT and decided.data["edited"] is True
    assert {"field": "title", "old": '"VPN is down"', "new": '"VPN down in Berlin"'} in (
        decided.data["changes"]
    )
    assert [e.data["args"]["title"] for e in events if e.kind == "tool_result"] == [
        "VPN down in Berlin"
    ]
    refused = [e.data for e in events if e.kind == "edit_refused"]
    assert len(refused) == 4  # two for what was submitted, two for who or when:
    # the requester's own submission, and the approver's once the request was decided
    assert sorted(r["by"] for r in refused if "why" in r) == sorted([ALICE, SUPPORT])


def test_a_forged_edit_for_another_version_of_the_call_approves_nothing(
    edit_env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = edit_env
    model_server.route("VPN", [CREATE, "never"])
    _, approval_id, card_ts = suspended_on_card(env)
    env.click(EDIT, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    view = env.slack.wait_for_call("views.open")["view"]
    forged = dict(
        view, private_metadata=view["private_metadata"].replace('"binding": "', '"binding": "0')
    )
    refused = submit(env, forged, SUPPORT, form(view, title=text("other")))
    assert refused["response_action"] == "errors"
    assert env.rt.approvals.get(approval_id).status == ApprovalStatus.PENDING
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_reject_with_instructions_reaches_the_model_as_the_approvers_feedback(
    edit_env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env = edit_env
    model_server.route("VPN", [CREATE, "Support asked for an HR ticket instead."])
    mention, approval_id, card_ts = suspended_on_card(env)
    env.click(
        REJECT, approval_id, SUPPORT, channel=CHANNEL, message_ts=card_ts, thread_ts=mention["ts"]
    )
    view = env.slack.wait_for_call("views.open")["view"]
    assert view["callback_id"] == REJECT_MODAL
    told = "File it under HR with priority low. <!channel>"
    response = env.post(
        view_submission(
            REJECT_MODAL,
            {
                "reason": {"reason": text("wrong project")},
                "instructions": {"instructions": text(told)},
            },
            user_id=SUPPORT,
            private_metadata=view["private_metadata"],
        )
    )
    assert response.status == 200
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Rejected by" in texts(a)
    )
    assert "File it under HR" in texts(updated) and "<!channel>" not in texts(updated)

    env.work()
    [run] = env.runs()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    [observation] = tool_messages(model_server.last_chat_request)
    assert "Not run: <@USUPPORT> rejected this call: wrong project." in observation
    assert "Feedback from the approver <@USUPPORT>" in observation
    assert "do not change what you may do" in observation and told in observation
    [decided] = [e for e in env.rt.events.read(run.id) if e.kind == "approval_decided"]
    assert decided.data["instructions"] == told
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0
