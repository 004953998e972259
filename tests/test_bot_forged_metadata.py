"""Issue 21, item 8: a modal's private_metadata is the sender's to forge. Its channel and
ts must never choose which card is updated: the cards come from the stored approval
request. Before: approving A with edits, with metadata pointing at pending request B's
card, overwrote B's card with A's outcome and removed B's buttons.

End to end over signed HTTP: the real Bolt app, FakeSlack, FakeOpenAI, Redis, RQ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from approvals import ApprovalRequest, ApprovalStatus
from bot.render.blocks import APPROVE, EDIT, EDIT_MODAL, REJECT, REJECT_MODAL
from bot.transport.payloads import Clicked
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention, view_submission
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, CHANNEL, SUPPORT, BotEnv, bot_env, buttons, texts
from tests.test_bot_edit import POLICY, form, text
from tests.test_bot_flow import CREATE, suspended_on_card

PRINTER = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer on fire"})])


@pytest.fixture
def two_cards(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[tuple[BotEnv, ApprovalRequest, ApprovalRequest]]:
    """Two questions, each waiting on its own card: (env, A, B)."""
    model_server.route("VPN", [CREATE, "Filed the VPN ticket."])
    model_server.route("printer", [PRINTER, "Filed the printer ticket."])
    with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY) as env:
        _, a_id, _ = suspended_on_card(env)
        env.event(app_mention("<@UBOT> please file a ticket: the printer is on fire", user=ALICE))
        env.wait_for_runs(2)
        env.work()
        b = wait_until(
            lambda: next((r for r in env.rt.approvals.pending() if r.id != a_id and r.cards), None),
            what="the second card",
        )
        yield env, env.rt.approvals.get(a_id), b


def forged(view: dict[str, Any], card: dict[str, str]) -> str:
    """The modal's metadata with another card's channel and ts in it."""
    meta = json.loads(view["private_metadata"])
    meta.update(channel=card["channel"], ts=card["ts"])
    return json.dumps(meta)


def assert_untouched(env: BotEnv, b: ApprovalRequest) -> None:
    env.settle()  # every listener started so far is done
    [card] = b.cards
    assert [c for c in env.slack.calls("chat.update") if c["ts"] == card["ts"]] == []
    shown = env.slack.message(card["channel"], card["ts"])
    assert shown is not None and buttons(shown["blocks"])[APPROVE] == b.id
    assert env.rt.approvals.get(b.id).status == ApprovalStatus.PENDING


def test_an_edit_submission_pointing_at_another_card_leaves_that_card_untouched(
    two_cards: tuple[BotEnv, ApprovalRequest, ApprovalRequest],
) -> None:
    env, a, b = two_cards
    [a_card], [b_card] = a.cards, b.cards
    env.click(EDIT, a.id, SUPPORT, channel=CHANNEL, message_ts=a_card["ts"])
    view = env.slack.wait_for_call("views.open", lambda v: v["view"]["callback_id"] == EDIT_MODAL)
    view = view["view"]
    values = form(view, title=text("VPN down in Berlin"))
    response = env.post(
        view_submission(EDIT_MODAL, values, user_id=SUPPORT, private_metadata=forged(view, b_card))
    )
    assert response.status == 200 and response.body == ""  # accepted: A is decided
    env.slack.wait_for_call(
        "chat.update", lambda c: c["ts"] == a_card["ts"] and "Approved with edits" in texts(c)
    )
    assert env.rt.approvals.get(a.id).status == ApprovalStatus.APPROVED
    assert_untouched(env, b)


def test_a_reject_submission_pointing_at_another_card_leaves_that_card_untouched(
    two_cards: tuple[BotEnv, ApprovalRequest, ApprovalRequest],
) -> None:
    env, a, b = two_cards
    [a_card], [b_card] = a.cards, b.cards
    env.click(REJECT, a.id, SUPPORT, channel=CHANNEL, message_ts=a_card["ts"])
    view = env.slack.wait_for_call(
        "views.open", lambda v: v["view"]["callback_id"] == REJECT_MODAL
    )["view"]
    values = {"reason": {"reason": {"type": "plain_text_input", "value": "not now"}}}
    response = env.post(
        view_submission(
            REJECT_MODAL, values, user_id=SUPPORT, private_metadata=forged(view, b_card)
        )
    )
    assert response.status == 200
    env.slack.wait_for_call(
        "chat.update", lambda c: c["ts"] == a_card["ts"] and "Rejected by" in texts(c)
    )
    assert env.rt.approvals.get(a.id).status == ApprovalStatus.REJECTED
    assert_untouched(env, b)


ts_text = st.one_of(
    st.sampled_from(["1700000000.000100", "1700000000.000200", ""]), st.text(max_size=20)
)
channel_text = st.one_of(st.sampled_from(["C0001", "C0002", ""]), st.text(max_size=12))
cards_strategy = st.lists(
    st.fixed_dictionaries({"channel": channel_text, "ts": ts_text}), max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    meta=st.dictionaries(
        st.sampled_from(["channel", "ts", "thread_ts", "home", "page", "approval_id", "x"]),
        st.one_of(channel_text, ts_text),
    ),
    cards=cards_strategy,
)
def test_a_submission_answers_at_one_of_the_stored_cards_or_nowhere(
    meta: dict[str, str], cards: list[dict[str, str]]
) -> None:
    who = Clicked.submitted(SUPPORT, "T0001", meta, cards)
    where = (who.channel, who.message_ts)
    assert where == ("", "") or where in {(c["channel"], c["ts"]) for c in cards}
    assert who.card is None or who.card in [{"channel": c["channel"], "ts": c["ts"]} for c in cards]
    if not who.message_ts:
        assert who.thread_ts == ""  # no card, no thread of one
