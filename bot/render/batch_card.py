"""Several writes from one turn on one card: a decision per item, plus Approve all and
Reject all (bot.listeners.batch). Each item stays its own request, bound to its own
arguments, decided and recorded on its own (`approval_decided` per item); the batch is
only a list of ids (`ApprovalStore.create_batch`) and the card that shows them.
"""

from __future__ import annotations

from typing import Any

import structlog

from approvals import ApprovalRequest
from bot.render import messages as m
from bot.render.blocks import (
    APPROVE_ALL,
    EDIT,
    REJECT,
    REJECT_ALL,
    SHOW_ARGS,
    Message,
    actions,
    approve_button,
    button,
    code_block,
    confirm_dialog,
    context,
    header,
    outcome_text,
    section,
    unseen_text,
)
from bot.render.mrkdwn import cut, date, escape, has_bidi, mention, pretty_json_cut

log = structlog.get_logger(__name__)

ITEMS_PER_CARD = 10  # 3 blocks each: well under 50 blocks and ~11k characters a message
ITEM_ARGS = 600


def batch_card(
    batch_id: str,
    requests: list[ApprovalRequest],
    *,
    approvers: str,
    high_risk: set[str],
    descriptions: dict[str, str] | None = None,
    elsewhere: str | None = None,
) -> Message:
    """The card: each item with its own buttons (or its outcome), then the batch buttons
    while anything is still pending."""
    first = requests[0]
    blocks: list[dict[str, Any]] = [
        header(m.BATCH_HEADER.format(count=len(requests))),
        section(m.BATCH_ASKED.format(user=mention(first.requester), count=len(requests))),
    ]
    hidden: set[str] = set()  # items whose arguments the card does not show in full
    for n, request in enumerate(requests[:ITEMS_PER_CARD], start=1):
        args_text, cut_paths = pretty_json_cut(request.args)
        bidi = has_bidi(args_text)
        past_preview = len(args_text) > ITEM_ARGS
        if past_preview:
            args_text = args_text[:ITEM_ARGS] + "\n…"
        was_cut = bool(cut_paths) or past_preview
        described = ((descriptions or {}).get(request.tool, "").strip().splitlines() or [""])[0]
        blocks.append(
            section(
                m.BATCH_ITEM.format(
                    n=n, tool=escape(request.tool), description=cut(escape(described), 300)
                )
                + "\n"
                + code_block(args_text)
            )
        )
        notes = [m.CARD_BIDI] if bidi else []
        if was_cut:
            notes.append(m.CARD_ARGS_CUT)
        if request.decided:
            notes.append(outcome_text(request))
        if notes:
            blocks.append(context(*notes))
        elements = []
        if not request.decided:
            elements = [
                approve_button(
                    request,
                    high_risk=request.tool in high_risk,
                    unseen=unseen_text(cut_paths, past_preview, bidi),
                ),
                button(m.EDIT, EDIT, request.id),
                button(m.REJECT, REJECT, request.id, style="danger"),
            ]
        if was_cut or bidi:
            hidden.add(request.id)
            elements.append(button(m.SHOW_ALL, SHOW_ARGS, request.id))
        if elements:
            blocks.append(actions(*elements, block_id=f"sb_item_{n}"))
    notes = [m.CARD_WHO.format(approvers=escape(approvers), expires=date(first.expires_at))]
    if elsewhere:
        notes.append(elsewhere)
    blocks.append(context(*notes))
    pending = [r for r in requests if not r.decided]
    if pending:
        confirm = None
        unseen = sum(r.id in hidden for r in pending)
        risky = any(r.tool in high_risk for r in pending)
        if unseen or risky:
            confirm = confirm_dialog(
                m.CONFIRM_APPROVE_TITLE,
                m.BATCH_CONFIRM.format(count=len(pending))
                + (m.BATCH_CONFIRM_RISKY if risky else "")
                + (m.BATCH_CONFIRM_HIDDEN.format(count=unseen) if unseen else ""),
                m.CONFIRM_APPROVE_YES,
                m.CONFIRM_APPROVE_NO,
            )
        blocks.append(
            actions(
                button(m.APPROVE_ALL, APPROVE_ALL, batch_id, style="primary", confirm=confirm),
                button(m.REJECT_ALL, REJECT_ALL, batch_id, style="danger"),
                block_id="sb_batch",
            )
        )
    text = m.BATCH_FALLBACK.format(user=mention(first.requester), count=len(requests))
    return Message(text=text, blocks=blocks)
