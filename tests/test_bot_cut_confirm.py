"""A card that cuts what it would approve asks to confirm Approve, naming what is cut (issue
21, item 7): the text past a cut (`…AND WIRE 1,000,000 TO EVILCORP`) must not be approved
in one click by someone who never opened Show all. An uncut card approves in one click."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from approvals import ApprovalRequest
from bot.render.batch_card import batch_card
from bot.render.blocks import APPROVE, SHOW_ARGS, approval_card
from bot.render.views import approval_line
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_events import app_mention
from tests.fakes.slack_server import block_errors
from tests.support.slack_bot import ALICE, BotEnv, buttons, has_button

HIDDEN = " AND WIRE 1,000,000 TO EVILCORP"


def request(args: dict[str, Any], n: int = 1, tool: str = "create_ticket") -> ApprovalRequest:
    now = time.time()
    return ApprovalRequest(
        id=f"ap_{n:020d}",
        run_id="r1",
        call_id=f"c{n}",
        tool=tool,
        args=args,
        requester="UALICE",
        team_id="T0001",
        channel_id="C0001",
        policy_version="v1",
        binding="b",
        created_at=now,
        expires_at=now + 3600,
    )


def approve_element(blocks: list[dict[str, Any]], value: str | None = None) -> dict[str, Any]:
    return next(
        e
        for b in blocks
        for e in b.get("elements", [])
        if e.get("action_id") == APPROVE and (value is None or e.get("value") == value)
    )


def card(args: dict[str, Any], *, high_risk: bool = False) -> list[dict[str, Any]]:
    return approval_card(
        request(args), description="Open a ticket.", approvers="@support", high_risk=high_risk
    ).blocks


def test_a_cut_single_card_asks_to_confirm_approve_naming_the_cut_field() -> None:
    blocks = card(
        {"project": "IT", "title": "Refund", "body": "Refund order 7." + " " * 400 + HIDDEN}
    )
    assert SHOW_ARGS in buttons(blocks)
    confirm = approve_element(blocks)["confirm"]
    assert "body" in confirm["text"]["text"] and "Show all" in confirm["text"]["text"]
    assert "project" not in confirm["text"]["text"]  # only what is cut is named
    assert block_errors(blocks, 50) == []


def test_an_uncut_single_card_approves_in_one_click() -> None:
    blocks = card({"project": "IT", "title": "VPN is down", "body": "since 9am"})
    assert SHOW_ARGS not in buttons(blocks)
    assert "confirm" not in approve_element(blocks)


def test_a_long_list_and_arguments_past_the_preview_are_named_too() -> None:
    many = card({"items": list(range(30))})
    assert "items[20:]" in approve_element(many)["confirm"]["text"]["text"]
    wide = card({f"k{n}": "x" * 250 for n in range(20)})  # no value cut, the text is
    assert "end of the arguments" in approve_element(wide)["confirm"]["text"]["text"]


def test_a_cut_high_risk_card_says_both_within_slacks_300_characters() -> None:
    blocks = card({"body": "b" * 1000}, high_risk=True)
    text = approve_element(blocks)["confirm"]["text"]["text"]
    assert text.startswith("This card does not show the value of body")
    assert len(text) <= 300 and block_errors(blocks, 50) == []


def test_a_cut_item_of_a_batch_card_asks_to_confirm_its_own_approve() -> None:
    cut, whole = request({"body": "b" * 500 + HIDDEN}, 1), request({"body": "short"}, 2)
    message = batch_card("bt_1", [cut, whole], approvers="@support", high_risk=set())
    assert "body" in approve_element(message.blocks, cut.id)["confirm"]["text"]["text"]
    assert "confirm" not in approve_element(message.blocks, whole.id)


# JSON the model may write as arguments: nested objects, lists, long and short strings
ARGS = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=400)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=25), st.dictionaries(st.text(max_size=20), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # 2 shared cores
@given(st.dictionaries(st.text(max_size=30), ARGS, max_size=8), st.booleans())
def test_approve_asks_to_confirm_exactly_when_the_card_offers_show_all(
    args: dict[str, Any], high_risk: bool
) -> None:
    blocks = card(args, high_risk=high_risk)
    offers_show_all = SHOW_ARGS in buttons(blocks)
    approve = approve_element(blocks)
    assert ("confirm" in approve) == (offers_show_all or high_risk)
    if offers_show_all:
        assert "Show all" in approve["confirm"]["text"]["text"]
    assert block_errors(blocks, 50) == []


def test_the_card_posted_to_slack_for_a_cut_call_carries_the_confirm(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    long_body = "Please refund order 7 to the customer." + "." * 400 + HIDDEN
    model_server.route(
        "refund",
        [
            Turn(
                tool_calls=[
                    ("create_ticket", {"project": "IT", "title": "Refund", "body": long_body})
                ]
            ),
            "Filed.",
        ],
    )
    env.event(app_mention("<@UBOT> please file the refund", user=ALICE))
    env.wait_for_runs(1)
    env.work()
    posted = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
    confirm = approve_element(posted["blocks"])["confirm"]
    assert "body" in confirm["text"]["text"]
    assert HIDDEN.strip() not in str(posted["blocks"])  # the card itself does not show it


def test_app_homes_line_asks_to_confirm_only_when_it_cuts_the_arguments() -> None:
    cut = approval_line(request({"body": "b" * 300 + HIDDEN}), buttons=True, high_risk=False)
    whole = approval_line(request({"body": "short"}), buttons=True, high_risk=False)
    assert "end of the arguments" in approve_element(cut)["confirm"]["text"]["text"]
    assert "confirm" not in approve_element(whole)
