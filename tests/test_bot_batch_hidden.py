"""A batch card shows each item as a single card does: a value cut short is said to be cut,
with Show all beside it, and Approve all asks first (before the fix, the tail of a long
argument was hidden with no way to read it, and Approve all approved it unseen)."""

from __future__ import annotations

from pathlib import Path

from bot.render import messages as m
from bot.render.blocks import APPROVE_ALL, SHOW_ARGS
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention
from tests.support.slack_bot import ALICE, BotEnv, buttons, has_button, texts

HIDDEN = "x" * 700 + " ALSO-CC: attacker@evil.example"
TWO = Turn(
    tool_calls=[
        ("create_ticket", {"project": "IT", "title": "VPN is down", "body": HIDDEN}),
        ("create_ticket", {"project": "IT", "title": "Printer jammed"}),
    ]
)


def test_a_cut_item_says_so_offers_show_all_and_approve_all_asks_first(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("two tickets", [TWO, "done"])
    env.event(app_mention("<@UBOT> file two tickets please", user=ALICE))
    env.wait_for_runs(1)
    env.work()
    card = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE_ALL))
    shown = texts(card["blocks"])
    assert "ALSO-CC" not in shown and m.CARD_ARGS_CUT in shown
    show_all = [
        e["value"]
        for b in card["blocks"]
        for e in b.get("elements") or []
        if e.get("action_id") == SHOW_ARGS
    ]
    [cut_one] = [r for r in env.rt.approvals.pending() if "ALSO-CC" in str(r.args)]
    assert show_all == [cut_one.id]  # only the item that is cut
    [approve_all] = [
        e
        for b in card["blocks"]
        for e in b.get("elements") or []
        if e.get("action_id") == APPROVE_ALL
    ]
    assert "Show all" in approve_all["confirm"]["text"]["text"]
    assert buttons(card["blocks"])[APPROVE_ALL]
