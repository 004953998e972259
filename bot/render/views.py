"""Block Kit for modals, App Home and run lists (≤ 100 blocks, well under 250 kB)."""

from __future__ import annotations

import json
import time
from typing import Any

from approvals import ApprovalRequest
from approvals.request import INSTRUCTIONS_MAX
from bot.render import messages as m
from bot.render.blocks import (
    EDIT,
    HOME_PAGE,
    REJECT,
    REJECT_ALL_MODAL,
    REJECT_INSTRUCTIONS_BLOCK,
    REJECT_INSTRUCTIONS_INPUT,
    REJECT_MODAL,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
    SAVE_DEMO,
    SHOW_ARGS,
    VIEW_RUN,
    actions,
    approve_button,
    button,
    context,
    divider,
    header,
    section,
    why,
)
from bot.render.event_text import event_line, short_code
from bot.render.mrkdwn import (
    channel,
    cut,
    date,
    duration,
    escape,
    has_bidi,
    mention,
    neutralise_bidi,
    one_line,
    plain,
    split,
    to_mrkdwn,
)
from worker.events import Event
from worker.run import Run
from worker.service.runs import TraceRef

MAX_VIEW_BLOCKS = 100
MAX_EVENT_BLOCKS = 80
EVENT_TEXT = 1500  # per event block: 80 of them stay far below 250 kB
ARGS_PIECE = 2800  # per section of the Show all modal, fences included
ARGS_MODAL_CHARS = 200_000  # a modal's JSON must stay under Slack's 250 kB
REASON_MAX = 500
HOME_RUNS = 15
HOME_APPROVALS = 10
HOME_FAILURES = 5


def modal(title: str, blocks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "type": "modal",
        "title": {"type": "plain_text", "text": plain(title, 24)},
        "close": {"type": "plain_text", "text": m.CLOSE},
        "blocks": blocks[:MAX_VIEW_BLOCKS],
    }
    view.update(extra)
    return view


# -- approvals -----------------------------------------------------------------------------------


def reject_modal(request: ApprovalRequest, metadata: str) -> dict[str, Any]:
    intro = m.REJECT_INTRO.format(user=mention(request.requester), tool=escape(request.tool))
    return modal(
        m.MODAL_REJECT_TITLE,
        [section(intro), *reason_inputs()],
        callback_id=REJECT_MODAL,
        submit={"type": "plain_text", "text": m.SUBMIT_REJECT},
        private_metadata=metadata,
    )


def reject_all_modal(requester: str, count: int, metadata: str) -> dict[str, Any]:
    """Reject all: one reason (and instructions) for every item still pending."""
    intro = m.REJECT_ALL_INTRO.format(user=mention(requester), count=count)
    return modal(
        m.MODAL_REJECT_ALL_TITLE,
        [section(intro), *reason_inputs()],
        callback_id=REJECT_ALL_MODAL,
        submit={"type": "plain_text", "text": m.SUBMIT_REJECT_ALL},
        private_metadata=metadata,
    )


def reason_inputs() -> list[dict[str, Any]]:
    """A rejection's optional reason and instructions to the agent (Reject, Reject all)."""
    return [
        {
            "type": "input",
            "block_id": REJECT_REASON_BLOCK,
            "optional": True,
            "label": {"type": "plain_text", "text": m.REJECT_REASON_LABEL},
            "element": {
                "type": "plain_text_input",
                "action_id": REJECT_REASON_INPUT,
                "multiline": True,
                "max_length": REASON_MAX,
                "placeholder": {"type": "plain_text", "text": m.REJECT_REASON_PLACEHOLDER},
            },
        },
        {
            "type": "input",
            "block_id": REJECT_INSTRUCTIONS_BLOCK,
            "optional": True,
            "label": {"type": "plain_text", "text": m.REJECT_INSTRUCTIONS_LABEL},
            "element": {
                "type": "plain_text_input",
                "action_id": REJECT_INSTRUCTIONS_INPUT,
                "multiline": True,
                "max_length": INSTRUCTIONS_MAX,
                "placeholder": {
                    "type": "plain_text",
                    "text": m.REJECT_INSTRUCTIONS_PLACEHOLDER,
                },
            },
        },
    ]


def args_modal(request: ApprovalRequest) -> dict[str, Any]:
    """Every argument in full: indented JSON, or compact JSON when indenting would not fit
    in a modal (deep nesting); bidi controls written out and flagged as on the card. A tool's
    arguments are at most 32 KiB of JSON (tools.decode), which always fits compact."""
    blocks = [section(f"*{escape(request.tool)}* · {mention(request.requester)}")]
    shown = json.dumps(request.args, ensure_ascii=False, default=str)
    if has_bidi(shown):
        blocks.append(section(m.CARD_BIDI))
    room = MAX_VIEW_BLOCKS - len(blocks)
    for indent in (2, None):
        full = json.dumps(request.args, indent=indent, ensure_ascii=False, default=str)
        text = escape(neutralise_bidi(full)).replace("```", "`\u200b``")
        pieces = split(text, ARGS_PIECE)
        if len(pieces) <= room and len(text) <= ARGS_MODAL_CHARS:
            blocks += [section("```" + piece + "```") for piece in pieces]
            return modal(m.MODAL_ARGS_TITLE, blocks)
    blocks.append(section(m.ARGS_TOO_LARGE.format(approval_id=request.id)))
    return modal(m.MODAL_ARGS_TITLE, blocks)


# -- a run's trajectory --------------------------------------------------------------------------


def profile_line(run: Run) -> str:
    model = escape(run.model or "-")
    if run.profile is None:
        return m.RUN_NO_PROFILE.format(model=model)
    return m.RUN_PROFILE.format(name=escape(run.profile.name), model=model)


def run_modal(
    run: Run,
    events: list[Event],
    cancelled_by: str | None = None,
    *,
    offer_save: bool = False,
    note: str = "",
    trace: TraceRef | None = None,
) -> dict[str, Any]:
    """The trajectory. `offer_save`: the "Save as demonstration" button (for admins, on runs
    that can be saved); `note`: a line at the end, e.g. what saving did; `trace`: the run's
    trace, linked where SWITCHBOARD_TRACE_URL says it is shown."""
    reason = f" ({why(run, cancelled_by)})" if run.reason else ""
    blocks: list[dict[str, Any]] = [
        section(
            m.RUN_HEAD.format(
                run_id=run.id,
                status=m.STATUS_WORDS.get(run.status.value, run.status.value),
                reason=reason,
                user=mention(run.requester.user_id),
                channel=channel(run.requester.channel_id),
                when=date(run.created_at),
            )
        ),
        section(m.RUN_QUESTION.format(question=cut(escape(run.question), 2500))),
        section(
            m.RUN_DEMOS.format(demos=escape(", ".join(run.demos))) if run.demos else m.RUN_NO_DEMOS
        ),
        context(profile_line(run)),
        divider(),
    ]
    shown = [line for e in events if (line := event_line(e, run.created_at))]
    for line in shown[:MAX_EVENT_BLOCKS]:
        blocks.append(section(cut(line, EVENT_TEXT)))
    if len(shown) > MAX_EVENT_BLOCKS:
        blocks.append(
            context(m.RUN_MORE_EVENTS.format(count=len(shown) - MAX_EVENT_BLOCKS, run_id=run.id))
        )
    blocks.append(divider())
    if run.answer:
        blocks.append(section(m.RUN_ANSWER.format(answer=cut(to_mrkdwn(run.answer), 2800))))
    if run.detail and run.status.value != "completed":
        blocks.append(section(m.RUN_WHY.format(why=cut(escape(run.detail), 1000))))
    u = run.usage
    blocks.append(
        context(
            m.RUN_TOTALS.format(
                steps=u.steps,
                tool_calls=u.tool_calls,
                tokens=u.tokens,
                prompt=u.prompt_tokens,
                completion=u.completion_tokens,
                cost=u.cost,
                working=duration(u.active_seconds),
                elapsed=duration((run.ended_at or time.time()) - run.created_at),
            )
        )
    )
    if trace is not None and trace.url:
        blocks.append(context(m.RUN_TRACE.format(url=escape(trace.url), trace_id=trace.trace_id)))
    if offer_save:
        blocks.append(actions(button(m.SAVE_DEMO, SAVE_DEMO, run.id), block_id="sb_demo"))
        blocks.append(context(m.DEMO_SAVE_HINT))
    if note:
        blocks.append(section(note))
    return modal(m.MODAL_RUN_TITLE, blocks)


# -- lists -----------------------------------------------------------------------------------------


def run_line(run: Run) -> dict[str, Any]:
    block = section(
        m.RUN_LINE.format(
            run_id=run.id,
            status=m.STATUS_WORDS.get(run.status.value, run.status.value),
            when=date(run.created_at, "{date_short} {time}"),
            user=mention(run.requester.user_id),
            question=one_line(run.question, 150),
        )
    )
    block["accessory"] = button(m.VIEW, VIEW_RUN, run.id)
    return block


def runs_blocks(title: str, runs: list[Run], note: str = "") -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [section(f"*{title}*")]
    if note:
        blocks.append(context(note))
    if not runs:
        blocks.append(section(m.RUNS_NONE))
    blocks.extend(run_line(r) for r in runs[:20])
    return blocks


def approval_line(
    request: ApprovalRequest, *, buttons: bool, high_risk: bool = True
) -> list[dict[str, Any]]:
    text = m.HOME_WAITING_LINE.format(
        user=mention(request.requester),
        tool=escape(request.tool),
        args=short_code(request.args, 200),
        expires=date(request.expires_at),
    )
    if not buttons:
        return [section(text)]
    one_line = " ".join(json.dumps(request.args, ensure_ascii=False, default=str).split())
    unseen = m.CONFIRM_CUT_END if len(one_line) > 200 else ""  # short_code's cut, above
    return [
        section(text),
        actions(
            approve_button(request, high_risk=high_risk, unseen=unseen),
            button(m.EDIT, EDIT, request.id),
            button(m.REJECT, REJECT, request.id, style="danger"),
            button(m.SHOW_ALL, SHOW_ARGS, request.id),
            block_id=f"sb_home_{request.id}"[:255],
        ),
    ]


# -- App Home -------------------------------------------------------------------------------------


def home_view(
    *,
    mine: list[Run],
    waiting: list[ApprovalRequest],
    admin: bool,
    high_risk: frozenset[str] = frozenset(),
    recent: list[Run] | None = None,
    pending: list[ApprovalRequest] | None = None,
    failures: list[Run] | None = None,
    spend: tuple[float, int, int] | None = None,
    page: int = 0,
    allowed: list[dict[str, Any]] | None = None,
    connections: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`page`: which HOME_APPROVALS of `waiting` to show (every one can be reached).
    `allowed`: the "Allowed for you" section (bot/render/grants.py), after the waiting;
    `connections`: "Your connections" (bot/render/connections.py), after it."""
    blocks: list[dict[str, Any]] = [header(m.HOME_TITLE), context(m.HOME_INTRO)]
    blocks += [divider(), section(f"*{m.HOME_WAITING}*")]
    page = home_page(page, len(waiting))
    shown = waiting[page * HOME_APPROVALS : (page + 1) * HOME_APPROVALS]
    if not waiting:
        blocks.append(context(m.HOME_WAITING_NONE))
    for request in shown:
        blocks += approval_line(request, buttons=True, high_risk=request.tool in high_risk)
    if len(waiting) > HOME_APPROVALS:
        first = page * HOME_APPROVALS + 1
        blocks.append(
            context(m.HOME_PAGE.format(first=first, last=first + len(shown) - 1, of=len(waiting)))
        )
        nav = []
        if page > 0:
            nav.append(button(m.HOME_PREVIOUS, f"{HOME_PAGE}_previous", str(page - 1)))
        if (page + 1) * HOME_APPROVALS < len(waiting):
            nav.append(button(m.HOME_NEXT, f"{HOME_PAGE}_next", str(page + 1)))
        blocks.append(actions(*nav, block_id="sb_home_pages"))
    blocks += allowed or []
    blocks += connections or []
    blocks += [divider(), section(f"*{m.HOME_MINE}*")]
    blocks += [run_line(r) for r in mine[:HOME_RUNS]] or [context(m.HOME_NONE)]
    if admin:
        if spend is not None:
            cost, count, tokens = spend
            blocks += [
                divider(),
                section(m.HOME_SPEND.format(cost=cost, runs=count, tokens=tokens)),
            ]
        blocks += [divider(), section(f"*{m.HOME_ALL}*")]
        blocks += [run_line(r) for r in (recent or [])[:HOME_RUNS]] or [context(m.HOME_NONE)]
        blocks += [divider(), section(f"*{m.HOME_PENDING_ALL}*")]
        lines = [approval_line(r, buttons=False)[0] for r in (pending or [])[:HOME_APPROVALS]]
        blocks += lines or [context(m.HOME_NONE)]
        blocks += [divider(), section(f"*{m.HOME_FAILURES}*")]
        blocks += [run_line(r) for r in (failures or [])[:HOME_FAILURES]] or [context(m.HOME_NONE)]
    return {
        "type": "home",
        "blocks": blocks[:MAX_VIEW_BLOCKS],
        "private_metadata": json.dumps({"page": page}),
    }


def home_page(page: int, waiting: int) -> int:
    """`page` within the pages `waiting` requests fill (the last one if past it)."""
    pages = max(1, -(-waiting // HOME_APPROVALS))
    return min(max(page, 0), pages - 1)
