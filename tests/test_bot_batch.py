"""Several writes from one turn: one card, a decision per item, Approve all / Reject all;
end to end over signed HTTP (Bolt, FakeSlack, FakeOpenAI, Redis, RQ, SQLite tickets)."""

from __future__ import annotations

from pathlib import Path

from approvals import ApprovalStatus
from bot.render.blocks import (
    APPROVE,
    APPROVE_ALL,
    EDIT,
    REJECT_ALL,
    REJECT_ALL_MODAL,
    REJECT_INSTRUCTIONS_BLOCK,
    REJECT_INSTRUCTIONS_INPUT,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
)
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention, view_submission
from tests.support.runtime import tool_messages
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    STRANGER,
    SUPPORT,
    BotEnv,
    buttons,
    has_button,
    texts,
)
from tools.builtin.tickets import TicketStore
from worker.run import RunStatus

THREE = Turn(
    tool_calls=[
        ("create_ticket", {"project": "IT", "title": "VPN is down"}),
        ("create_ticket", {"project": "IT", "title": "Printer jammed"}),
        ("create_ticket", {"project": "HR", "title": "Badge expired"}),
    ]
)


def batch_card(env: BotEnv) -> tuple[dict, str, str]:
    """Mention, run until the run waits: (the card as posted, its batch id, its ts)."""
    mention = app_mention("<@UBOT> file three tickets please", user=ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    card = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE_ALL))
    assert card["thread_ts"] == mention["ts"]
    [run] = env.runs()
    [stored] = env.rt.approvals.get(env.rt.store.load(run.id).pending_approvals[0]).cards
    return card, buttons(card["blocks"])[APPROVE_ALL], stored["ts"]


def test_three_writes_share_one_card_and_one_click_decides_each_on_its_own(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("three tickets", [THREE, "Filed all three."])
    card, batch_id, card_ts = batch_card(env)
    [run] = env.runs()
    pending = env.rt.store.load(run.id).pending_approvals
    assert len(pending) == 3
    assert len([c for c in env.slack.calls("chat.postMessage") if has_button(APPROVE)(c)]) == 1
    shown = texts(card["blocks"])
    for title in ("VPN is down", "Printer jammed", "Badge expired"):
        assert title in shown
    assert buttons(card["blocks"])[REJECT_ALL] == batch_id

    env.click(APPROVE_ALL, batch_id, STRANGER, channel=CHANNEL, message_ts=card_ts)
    env.slack.wait_for_call("chat.postEphemeral", lambda a: a["user"] == STRANGER)
    assert all(env.rt.approvals.get(i).status == ApprovalStatus.PENDING for i in pending)

    env.click(APPROVE_ALL, batch_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and texts(a).count("Approved by") == 3
    )
    assert APPROVE_ALL not in buttons(updated["blocks"])
    decided = [e for e in env.rt.events.read(run.id) if e.kind == "approval_decided"]
    assert sorted(e.data["approval_id"] for e in decided) == sorted(pending)
    assert {e.data["by"] for e in decided} == {SUPPORT}

    env.work()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    store = TicketStore(tickets_db)
    assert store.count_executions("create_ticket") == 3
    titles = {store.get(n)["title"] for n in (1, 2, 3)}  # type: ignore[index]
    assert titles == {"VPN is down", "Printer jammed", "Badge expired"}
    ran = [e for e in env.rt.events.read(run.id) if e.kind == "tool_result"]
    assert sorted(e.data["approval_id"] for e in ran) == sorted(pending)
    assert len(tool_messages(model_server.last_chat_request)) == 3


def test_an_item_decided_on_its_own_leaves_the_rest_to_reject_all(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("three tickets", [THREE, "Filed one of three."])
    card, batch_id, card_ts = batch_card(env)
    [run] = env.runs()
    first, second, third = env.rt.store.load(run.id).pending_approvals
    item_buttons = [b for b in card["blocks"] if b.get("block_id", "").startswith("sb_item_")]
    assert [buttons([b])[EDIT] for b in item_buttons] == [first, second, third]

    env.click(APPROVE, second, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    updated = env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and "Approved by" in texts(a)
    )
    assert buttons(updated["blocks"])[REJECT_ALL] == batch_id  # the batch card, still open
    assert second not in buttons(updated["blocks"]).values()

    env.click(REJECT_ALL, batch_id, SUPPORT, channel=CHANNEL, message_ts=card_ts)
    modal = env.slack.wait_for_call(
        "views.open", lambda a: a["view"]["callback_id"] == REJECT_ALL_MODAL
    )["view"]
    assert "the 2 you may decide" in texts(modal["blocks"])
    assert not env.rt.approvals.get(first).decided  # nothing is rejected before the reason
    values = {
        REJECT_REASON_BLOCK: {REJECT_REASON_INPUT: {"type": "plain_text_input", "value": "dupes"}},
        REJECT_INSTRUCTIONS_BLOCK: {
            REJECT_INSTRUCTIONS_INPUT: {"type": "plain_text_input", "value": "file just one"}
        },
    }
    meta = modal["private_metadata"]
    env.post(view_submission(REJECT_ALL_MODAL, values, user_id=SUPPORT, private_metadata=meta))
    env.slack.wait_for_call(
        "chat.update", lambda a: a["ts"] == card_ts and texts(a).count("Rejected by") == 2
    )
    statuses = [env.rt.approvals.get(i).status for i in (first, second, third)]
    assert statuses == [ApprovalStatus.REJECTED, ApprovalStatus.APPROVED, ApprovalStatus.REJECTED]
    assert env.rt.approvals.get(third).reason == "dupes"

    env.work()
    assert env.rt.store.load(run.id).status == RunStatus.COMPLETED
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
    observations = tool_messages(model_server.last_chat_request)
    assert [("rejected" in o) for o in observations] == [True, False, True]
    assert "dupes" in observations[0] and "file just one" in observations[2]
