"""Block Kit rendering stays inside Slack's limits and never lets model text ping or link."""

from __future__ import annotations

import json
import time

from approvals import ApprovalRequest, ApprovalStatus
from bot.render.blocks import (
    APPROVE,
    SHOW_ARGS,
    VIEW_RUN,
    answer_messages,
    approval_card,
    outcome_text,
)
from bot.render.mrkdwn import escape, split, to_mrkdwn
from bot.render.views import home_view, run_modal
from bot.transport.slash import parse
from tests.fakes.slack_server import block_errors, blocks_text_length
from tests.support.slack_bot import buttons, texts
from worker.events import Event
from worker.run import EndReason, Requester, Run, RunStatus

SOFT_LIMIT = 11_000  # Slack refuses messages around 11–13k characters of block text


def run_with(answer: str | None, **fields: object) -> Run:
    now = time.time()
    return Run(
        id="r18c2f3a9b1c2d3e4f5",
        question="q",
        requester=Requester(user_id="UALICE", team_id="T0001", channel_id="C0001"),
        status=fields.pop("status", RunStatus.COMPLETED),
        answer=answer,
        created_at=now - 10,
        ended_at=now,
        **fields,
    )


def request(
    args: dict[str, object], status: ApprovalStatus = ApprovalStatus.PENDING, **fields: object
) -> ApprovalRequest:
    now = time.time()
    fields.setdefault("id", "ap_" + "1" * 20)
    return ApprovalRequest(
        run_id="r1",
        call_id="c1",
        tool="create_ticket",
        args=args,
        requester="UALICE",
        team_id="T0001",
        channel_id="C0001",
        policy_version="v1",
        binding="b",
        created_at=now,
        expires_at=now + 3600,
        status=status,
        **fields,  # type: ignore[arg-type]
    )


def test_model_text_cannot_ping_mention_or_forge_links() -> None:
    hostile = "Hi <!channel> <!here> <@UCEO> <https://evil.example|bank> & **bold** [docs](https://ok.example/a?b=1&c=2)"
    [message] = answer_messages(run_with(hostile))
    shown = texts(message.blocks) + message.text
    for forbidden in ("<!channel>", "<!here>", "<@UCEO>", "<https://evil.example"):
        assert forbidden not in shown
    assert "&lt;!channel&gt;" in shown and "&amp;" in shown
    assert "*bold*" in shown and "<https://ok.example/a?b=1&amp;c=2|docs>" in shown


def test_a_long_answer_is_split_into_messages_slack_accepts() -> None:
    paragraph = "word " * 300 + "\n\n```\n" + "code line\n" * 200 + "```\n"
    messages = answer_messages(run_with(paragraph * 8))
    assert len(messages) > 1
    for message in messages:
        assert block_errors(message.blocks, 50) == []
        assert blocks_text_length(message.blocks) < SOFT_LIMIT
        for block in message.blocks:
            if block["type"] == "section":
                assert block["text"]["text"].count("```") % 2 == 0  # fences balanced per piece
    assert VIEW_RUN in buttons(messages[-1].blocks)
    assert all(VIEW_RUN not in buttons(m.blocks) for m in messages[:-1])


def test_a_huge_answer_is_cut_with_a_note() -> None:
    messages = answer_messages(run_with("x" * 200_000))
    assert len(messages) <= 4
    assert "too long" in texts(messages[-1].blocks)


def test_partial_and_failed_endings_say_why_in_plain_words() -> None:
    [budget] = answer_messages(
        run_with(None, status=RunStatus.PARTIAL, reason=EndReason.MAX_STEPS, detail="8 steps")
    )
    assert "reached its step limit" in texts(budget.blocks)
    [cancelled] = answer_messages(
        run_with(None, status=RunStatus.PARTIAL, reason=EndReason.CANCELLED), "UBOB"
    )
    assert "<@UBOB> cancelled the run" in texts(cancelled.blocks)
    [refused] = answer_messages(
        run_with(
            None,
            status=RunStatus.PARTIAL,
            reason=EndReason.REFUSED,
            detail="the model refused: <!here> no",
        )
    )
    assert "the model refused" in texts(refused.blocks) and "<!here>" not in texts(refused.blocks)
    [failed] = answer_messages(
        run_with(None, status=RunStatus.FAILED, reason=EndReason.INTERNAL_ERROR)
    )
    assert "failed" in texts(failed.blocks) and "r18c2f3a9b1c2d3e4f5" in texts(failed.blocks)


def test_approval_card_cuts_long_values_and_confirms_high_risk() -> None:
    pending = request({"title": "t", "body": "<!channel> " + "b" * 10_000, "n": list(range(50))})
    card = approval_card(
        pending, description="Open a ticket.", approvers="@support", high_risk=True
    )
    assert block_errors(card.blocks, 50) == []
    assert blocks_text_length(card.blocks) < SOFT_LIMIT
    found = buttons(card.blocks)
    assert found[APPROVE] == pending.id and found[SHOW_ARGS] == pending.id
    approve = next(
        e for b in card.blocks for e in b.get("elements", []) if e.get("action_id") == APPROVE
    )
    assert "confirm" in approve
    assert "<!channel>" not in texts(card.blocks)

    rejected = request(
        {"title": "t"},
        ApprovalStatus.REJECTED,
        decided_by="USUPPORT",
        decided_at=time.time(),
        reason="wrong <project>",
    )
    done = approval_card(
        rejected,
        description="",
        approvers="@support",
        high_risk=False,
        outcome=outcome_text(rejected),
    )
    assert APPROVE not in buttons(done.blocks)
    assert "Rejected by <@USUPPORT>: wrong &lt;project&gt;" in texts(done.blocks)
    expired = request({"title": "t"}, ApprovalStatus.EXPIRED)
    assert "Expired" in outcome_text(expired)
    withdrawn = request({}, ApprovalStatus.WITHDRAWN, reason="cancelled by <@UALICE>")
    assert "Withdrawn" in outcome_text(withdrawn) and "cancelled" in outcome_text(withdrawn)


def test_run_modal_and_home_stay_within_view_limits() -> None:
    run = run_with("done " * 2000, demos=["fees-1"])
    events = [
        Event(
            id=f"{n}-0",
            at=run.created_at + n,
            kind="tool_result",
            data={"tool": "search_tickets", "ok": True, "result": "<!here> " + "r" * 4000},
        )
        for n in range(300)
    ]
    view = run_modal(run, events)
    assert block_errors(view["blocks"], 100) == []
    assert len(json.dumps(view)) < 250_000
    assert "<!here>" not in texts(view["blocks"]) and "more events" in texts(view["blocks"])

    many = [run_with("a") for _ in range(40)]
    pending = [request({"x": "y" * 500}, id=f"ap_{n:020d}") for n in range(30)]
    home = home_view(
        mine=many,
        waiting=pending,
        admin=True,
        recent=many,
        pending=pending,
        failures=many,
        spend=(1.5, 40, 1000),
    )
    assert block_errors(home["blocks"], 100) == []
    assert len(json.dumps(home)) < 250_000


def test_split_keeps_pieces_under_the_limit() -> None:
    text = escape("a&b " * 5000)
    pieces = split(text, 2900)
    assert all(len(p) <= 2900 for p in pieces)
    assert "".join(p.replace("\n", " ") for p in pieces).count("&amp;") == 5000
    assert to_mrkdwn("# Title\n__x__ ~~y~~") == "*Title*\n*x* ~y~"


def test_command_parsing_is_bounded() -> None:
    assert parse("").verb == "help"
    assert parse("runs all failed").status == RunStatus.FAILED
    assert parse("runs <@UBOB|bob>").user == "UBOB"
    assert parse("run r18c2f3a9b1c2d3e4f5").run_id == "r18c2f3a9b1c2d3e4f5"
    assert parse("run <script>").verb == "error"
    assert parse("runs " + "x" * 300).verb == "error"
    assert parse("delete everything").verb == "error"
