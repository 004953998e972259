"""Block Kit for messages: the status message, answers with their footer, approval cards.

Pure functions from our records to Slack payloads, sized to Slack's limits
(section text 3,000; 50 blocks; refused past ~11k characters of block text per message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from approvals import ApprovalRequest, ApprovalStatus
from approvals.edits import changes, shown
from bot.render import messages as m
from bot.render.mrkdwn import (
    clock,
    code,
    code_block,
    cut,
    date,
    duration,
    escape,
    has_bidi,
    mention,
    plain,
    pretty_json_cut,
    split,
    to_mrkdwn,
)
from tools.policy import Policy
from worker.run import EndReason, Run, RunStatus

# action and callback ids (not shown to people)
APPROVE = "sb_approve"
REJECT = "sb_reject"
CANCEL = "sb_cancel"
SHOW_ARGS = "sb_show_args"
VIEW_RUN = "sb_view_run"
SAVE_DEMO = "sb_save_demo"
# App Home's Previous/Next (HOME_PAGE + "_previous"/"_next"); value: the page to show
HOME_PAGE = "sb_home_page"
REJECT_MODAL = "sb_reject_modal"
REJECT_REASON_BLOCK = "reason"
REJECT_REASON_INPUT = "reason"
REJECT_INSTRUCTIONS_BLOCK = "instructions"
REJECT_INSTRUCTIONS_INPUT = "instructions"
EDIT = "sb_edit"
APPROVE_ALL = "sb_approve_all"
REJECT_ALL = "sb_reject_all"
REJECT_ALL_MODAL = "sb_reject_all_modal"
EDIT_MODAL = "sb_edit_modal"

SECTION_LIMIT = 3000
PIECE = 2900  # answer text per section, leaving room for fences
SECTIONS_PER_MESSAGE = 3  # ~8.7k characters: well under the ~11k a message may carry
MAX_ANSWER_SECTIONS = 12
ARGS_PREVIEW = 2400
BUTTON_TEXT = 75


@dataclass(frozen=True)
class Message:
    text: str  # notification / fallback text (escaped)
    blocks: list[dict[str, Any]] = field(default_factory=list)


# -- primitives ------------------------------------------------------------------------------


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text, SECTION_LIMIT)}}


def context(*texts: str) -> dict[str, Any]:
    return {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": cut(t, SECTION_LIMIT)} for t in texts[:10]],
    }


def header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": plain(text, 150)}}


def divider() -> dict[str, Any]:
    return {"type": "divider"}


def button(
    text: str,
    action_id: str,
    value: str,
    *,
    style: str | None = None,
    confirm: dict[str, Any] | None = None,
) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": plain(text, BUTTON_TEXT)},
        "action_id": action_id,
        "value": value,
    }
    if style:
        element["style"] = style
    if confirm:
        element["confirm"] = confirm
    return element


def actions(*elements: dict[str, Any], block_id: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "actions", "elements": list(elements)}
    if block_id:
        block["block_id"] = block_id
    return block


def confirm_dialog(title: str, text: str, yes: str, no: str) -> dict[str, Any]:
    return {
        "title": {"type": "plain_text", "text": plain(title, 100)},
        "text": {"type": "mrkdwn", "text": cut(text, 300)},
        "confirm": {"type": "plain_text", "text": plain(yes, 30)},
        "deny": {"type": "plain_text", "text": plain(no, 30)},
    }


# -- the status message --------------------------------------------------------------------------


def status_working(run: Run, text: str) -> Message:
    line = m.STATUS_WORKING.format(text=escape(text))
    cancel = button(
        m.CANCEL,
        CANCEL,
        run.id,
        confirm=confirm_dialog(
            m.CONFIRM_CANCEL_TITLE, m.CONFIRM_CANCEL_TEXT, m.CONFIRM_CANCEL_YES, m.CONFIRM_CANCEL_NO
        ),
    )
    return Message(
        text=m.STATUS_FALLBACK.format(text=escape(text)),
        blocks=[
            section(line),
            context(m.STATUS_FOR.format(user=mention(run.requester.user_id))),
            actions(cancel, block_id="sb_status"),
        ],
    )


def status_final(run: Run, cancelled_by: str | None) -> Message:
    if run.status == RunStatus.COMPLETED:
        line = m.STATUS_DONE.format(summary=summary(run))
    elif run.status == RunStatus.FAILED:
        line = m.STATUS_FAILED.format(why=why(run, cancelled_by))
    else:
        line = m.STATUS_PARTIAL.format(why=why(run, cancelled_by))
    return Message(
        text=m.STATUS_FALLBACK.format(text=line),
        blocks=[section(line), context(m.STATUS_FOR.format(user=mention(run.requester.user_id)))],
    )


def summary(run: Run) -> str:
    steps = m.FOOTER_STEPS if run.usage.steps == 1 else m.FOOTER_STEPS_PLURAL
    return steps.format(n=run.usage.steps) + ", " + duration(run.usage.active_seconds)


def why(run: Run, cancelled_by: str | None = None) -> str:
    """The ending in plain words: ours only, so nothing here needs escaping."""
    if run.reason == EndReason.CANCELLED and cancelled_by:
        return m.CANCELLED_BY.format(user=mention(cancelled_by))
    if run.reason is None:
        return m.REASON_UNKNOWN
    return m.REASONS.get(run.reason.value, m.REASON_UNKNOWN)


# -- answers -----------------------------------------------------------------------------------


def answer_messages(run: Run, cancelled_by: str | None = None) -> list[Message]:
    """The answer (or why there is none) split into messages Slack accepts; the last one
    carries the footer and the View run button."""
    sections = ending_sections(run, cancelled_by)
    if len(sections) > MAX_ANSWER_SECTIONS:
        sections = [*sections[: MAX_ANSWER_SECTIONS - 1], m.ANSWER_CUT]
    fallback = cut(escape(" ".join((run.answer or "").split())), 300) or why(run)
    out: list[Message] = []
    for start in range(0, len(sections), SECTIONS_PER_MESSAGE):
        chunk = sections[start : start + SECTIONS_PER_MESSAGE]
        out.append(Message(text=fallback or m.ANSWER_FALLBACK, blocks=[section(s) for s in chunk]))
    out[-1].blocks.extend(footer(run))
    return out


def ending_sections(run: Run, cancelled_by: str | None) -> list[str]:
    if run.status == RunStatus.FAILED:
        return [m.FAILED_HEAD.format(run_id=run.id)]
    answer = split(to_mrkdwn(run.answer), PIECE) if run.answer else []
    if run.status == RunStatus.COMPLETED:
        return answer or [m.ANSWER_FALLBACK]
    head = m.PARTIAL_HEAD.format(why=why(run, cancelled_by))
    if run.detail and run.reason != EndReason.CANCELLED:
        head += "\n" + m.PARTIAL_DETAIL.format(detail=cut(escape(run.detail), 600))
    if answer:
        return [head + "\n" + m.PARTIAL_SO_FAR, *answer]
    return [head]


def tools_used(run: Run) -> list[str]:
    names: list[str] = []
    for message in run.messages:
        for call in message.get("tool_calls") or []:
            name = str(call.get("function", {}).get("name", ""))
            if name and name not in names:
                names.append(name)
    return names


def footer(run: Run) -> list[dict[str, Any]]:
    u = run.usage
    names = tools_used(run)
    tools = m.FOOTER_TOOLS.format(names=escape(", ".join(names))) if names else m.FOOTER_NO_TOOLS
    elapsed = (run.ended_at or run.updated_at) - run.created_at
    if elapsed > u.active_seconds + 5:
        spent = m.FOOTER_TIME_WAITED.format(
            working=duration(u.active_seconds), total=duration(elapsed)
        )
    else:
        spent = m.FOOTER_TIME.format(working=duration(u.active_seconds))
    steps = (m.FOOTER_STEPS if u.steps == 1 else m.FOOTER_STEPS_PLURAL).format(n=u.steps)
    line = m.FOOTER.format(
        steps=steps,
        tools=cut(tools, 400),
        tokens=m.FOOTER_TOKENS.format(n=u.tokens),
        cost=m.FOOTER_COST.format(cost=u.cost),
        time=spent,
    )
    if run.profile is not None:
        line = m.FOOTER_PROFILE.format(name=escape(run.profile.name)) + " · " + line
    return [context(line), actions(button(m.VIEW_RUN, VIEW_RUN, run.id), block_id="sb_footer")]


# -- approval cards -------------------------------------------------------------------------------


def approval_card(
    request: ApprovalRequest,
    *,
    description: str,
    approvers: str,
    high_risk: bool,
    elsewhere: str | None = None,
    outcome: str | None = None,
    offers: list[dict[str, Any]] | None = None,
    acts_as: str | None = None,
) -> Message:
    """The card while pending (`outcome` None: with buttons) or once resolved (no
    decision buttons, the outcome in their place). `offers`: more buttons while pending
    (the standing grants the policy allows, bot/render/grants.py). `acts_as`: the provider
    a per-user tool acts through ("GitHub"), said on the card."""
    args_text, cut_paths = pretty_json_cut(request.args)
    bidi = has_bidi(args_text)
    past_preview = len(args_text) > ARGS_PREVIEW
    if past_preview:
        args_text = args_text[:ARGS_PREVIEW] + "\n…"
    was_cut = bool(cut_paths) or past_preview
    first_line = (description.strip().splitlines() or [""])[0]
    blocks: list[dict[str, Any]] = [
        header(m.CARD_HEADER.format(tool=request.tool)),
        section(
            m.CARD_ASKED.format(
                user=mention(request.requester),
                tool=escape(request.tool),
                description=cut(escape(first_line), 500),
            )
        ),
        section(code_block(args_text)),
    ]
    if bidi:
        blocks.append(section(m.CARD_BIDI))
    notes = [m.CARD_WHO.format(approvers=escape(approvers), expires=date(request.expires_at))]
    if was_cut:
        notes.append(m.CARD_ARGS_CUT)
    if elsewhere:
        notes.append(elsewhere)
    if acts_as:
        notes.append(acting_as(request, acts_as))
    blocks.append(context(*notes))
    show_all = button(m.SHOW_ALL, SHOW_ARGS, request.id)
    if outcome is None:
        unseen = unseen_text(cut_paths, past_preview, bidi)
        elements = [
            approve_button(request, high_risk=high_risk, unseen=unseen),
            button(m.EDIT, EDIT, request.id),
            button(m.REJECT, REJECT, request.id, style="danger"),
        ]
        if was_cut or bidi:
            elements.append(show_all)
        blocks.append(actions(*elements, block_id="sb_decide"))
        if offers:
            blocks.append(actions(*offers, block_id="sb_grant"))
        text = m.CARD_FALLBACK.format(user=mention(request.requester), tool=escape(request.tool))
    else:
        blocks.append(section(outcome))
        if was_cut or bidi:
            blocks.append(actions(show_all, block_id="sb_show"))
        text = m.CARD_DECIDED_FALLBACK.format(tool=escape(request.tool), outcome=outcome)
    return Message(text=text, blocks=blocks)


def acting_as(request: ApprovalRequest, label: str) -> str:
    """Whose account a per-user write acts as: always the requester's."""
    return m.CARD_ACTS_AS.format(user=mention(request.requester), label=escape(label))


def approve_button(
    request: ApprovalRequest, *, high_risk: bool, unseen: str = ""
) -> dict[str, Any]:
    """The one Approve button, on cards and in App Home alike. It asks for a confirmation
    first when the tool is high-risk, or when the card does not show everything it would
    approve (`unseen`, from `unseen_text`): one click must not approve text nobody read."""
    tool = escape(request.tool)
    parts = []  # what is cut first: the dialog holds 300 characters
    if unseen:
        parts.append(m.CONFIRM_APPROVE_CUT_TEXT.format(what=unseen, tool=tool))
    if high_risk:
        parts.append(m.CONFIRM_APPROVE_TEXT.format(tool=tool))
    confirm = None
    if parts:
        confirm = confirm_dialog(
            m.CONFIRM_APPROVE_TITLE if high_risk else m.CONFIRM_APPROVE_CUT_TITLE,
            " ".join(parts),
            m.CONFIRM_APPROVE_YES,
            m.CONFIRM_APPROVE_NO,
        )
    return button(m.APPROVE, APPROVE, request.id, style="primary", confirm=confirm)


def unseen_text(cut_paths: list[str], past_preview: bool, bidi: bool) -> str:
    """What a card leaves out, in words for the confirmation ("" when it shows everything):
    the first few cut fields by name, the end of the arguments, direction controls."""
    parts = []
    if cut_paths:
        names = ", ".join(escape(cut(p or "the arguments", 40)) for p in cut_paths[:3])
        more = m.CONFIRM_CUT_MORE.format(count=len(cut_paths) - 3) if len(cut_paths) > 3 else ""
        parts.append(m.CONFIRM_CUT_FIELDS.format(fields=names + more))
    if past_preview:
        parts.append(m.CONFIRM_CUT_END)
    if bidi:
        parts.append(m.CONFIRM_CUT_BIDI)
    return "; ".join(parts)


def is_high_risk(policy: Policy, tool: str) -> bool:
    """A tool that is gone since it was asked for counts as high-risk."""
    try:
        return policy.rule(tool).high_risk
    except KeyError:
        return True


def outcome_text(request: ApprovalRequest, run_reason: EndReason | None = None) -> str:
    status = request.status
    if status == ApprovalStatus.APPROVED and request.original_args is not None:
        lines = [
            m.CARD_CHANGE.format(
                field=escape(c.field),
                old=code(shown(c.old, c.was_set)),
                new=code(shown(c.new, c.is_set)),
            )
            for c in changes(request.original_args, request.args)[:10]
        ]
        return m.CARD_APPROVED_EDITED.format(
            user=mention(request.decided_by),
            when=clock(request.decided_at),
            changes=cut("\n".join(lines), 2000),
        )
    if status == ApprovalStatus.APPROVED:
        return m.CARD_APPROVED.format(
            user=mention(request.decided_by), when=clock(request.decided_at)
        )
    if status == ApprovalStatus.REJECTED:
        told = ""
        if request.instructions:
            told = m.CARD_INSTRUCTIONS.format(text=cut(escape(request.instructions), 500))
        if request.reason:
            return (
                m.CARD_REJECTED_REASON.format(
                    user=mention(request.decided_by), reason=cut(escape(request.reason), 500)
                )
                + told
            )
        return m.CARD_REJECTED.format(user=mention(request.decided_by)) + told
    if status == ApprovalStatus.EXPIRED:
        return m.CARD_EXPIRED
    if status == ApprovalStatus.WITHDRAWN:
        if run_reason == EndReason.CANCELLED or "cancel" in request.reason.lower():
            return m.CARD_WITHDRAWN_CANCELLED
        return m.CARD_WITHDRAWN.format(reason=cut(escape(request.reason), 200))
    return ""
