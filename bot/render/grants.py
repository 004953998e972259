"""Block Kit for standing grants: the card's "Approve and allow…" buttons, the modal that
shows (and lets the approver widen) what the grant covers, the compact line a covered call
gets in its thread, and App Home's "Allowed for you" section. Its own module, so the card
and App Home change in one call each (bot/render/blocks.py, bot/render/views.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from approvals import ApprovalRequest
from approvals.edits import shown
from bot.render import messages as m
from bot.render.blocks import Message, button, context, divider, section
from bot.render.mrkdwn import clock, code, cut, date, escape, mention, plain
from bot.render.views import modal
from worker.service.grants import Grant

GRANT = "sb_grant"  # action ids GRANT + "_" + scope; value: the approval id
GRANT_MODAL = "sb_grant_modal"
REVOKE_GRANT = "sb_revoke_grant"  # value: the grant id
WIDEN_BLOCK = "widen"  # + the group's number: checkboxes hold 10 options each
WIDEN_INPUT = "widen"
OPTIONS_PER_GROUP = 10
MAX_GROUPS = 10  # 100 arguments at most can be widened; the rest stay fixed
HOME_GRANTS_SHOWN = 10


def grant_action(scope: str) -> str:
    return f"{GRANT}_{scope}"


def grant_buttons(request: ApprovalRequest, scopes: tuple[str, ...]) -> list[dict[str, Any]]:
    """The card's offers, one per scope the policy allows for the tool (none: none)."""
    return [
        button(m.GRANT_BUTTON[scope], grant_action(scope), request.id)
        for scope in scopes
        if scope in m.GRANT_BUTTON
    ]


def grant_modal(
    request: ApprovalRequest, scope: str, names: list[str], metadata: str
) -> dict[str, Any]:
    """What the grant would cover, every argument fixed to its value unless ticked."""
    user, tool = mention(request.requester), escape(request.tool)
    blocks: list[dict[str, Any]] = [
        section(m.GRANT_INTRO.format(user=user, tool=tool, where=m.GRANT_WHERE[scope])),
        section(fixed_text(request.args, names, tool)),
    ]
    groups = [names[i : i + OPTIONS_PER_GROUP] for i in range(0, len(names), OPTIONS_PER_GROUP)][
        :MAX_GROUPS
    ]
    for n, group in enumerate(groups):
        options = [
            {
                "text": {"type": "plain_text", "text": plain(name, 75)},
                "description": {
                    "type": "plain_text",
                    "text": plain(shown(request.args.get(name), name in request.args), 75),
                },
                "value": f"{n}:{i}",
            }
            for i, name in enumerate(group)
        ]
        blocks.append(
            {
                "type": "input",
                "block_id": f"{WIDEN_BLOCK}{n}",
                "optional": True,
                "label": {"type": "plain_text", "text": m.GRANT_WIDEN_LABEL},
                "hint": {"type": "plain_text", "text": m.GRANT_WIDEN_HINT},
                "element": {"type": "checkboxes", "action_id": WIDEN_INPUT, "options": options},
            }
        )
    blocks.append(context(m.GRANT_FOOTER))
    return modal(
        m.MODAL_GRANT_TITLE,
        blocks,
        callback_id=GRANT_MODAL,
        submit={"type": "plain_text", "text": m.SUBMIT_GRANT},
        private_metadata=metadata,
    )


def fixed_text(args: Mapping[str, Any], names: list[str], tool: str) -> str:
    """Every argument the grant would fix, with its value now (ticking one widens it)."""
    fixed = names
    if not fixed:
        return m.GRANT_FIXED_NONE.format(tool=tool)
    lines = [
        m.GRANT_FIXED_LINE.format(
            name=escape(cut(n, 60)), value=code(shown(args.get(n), n in args))
        )
        for n in fixed[:20]
    ]
    if len(fixed) > 20:
        lines.append(f"… and {len(fixed) - 20} more")
    return m.GRANT_FIXED.format(lines="\n".join(lines))


def read_widened(values: Any, names: list[str]) -> set[str] | None:
    """The arguments ticked in the modal's state (`view.state.values`): a set of names from
    `names`, or None when the state names an option the modal never offered (forged)."""
    if not isinstance(values, dict):
        return set()
    widened: set[str] = set()
    for n in range(MAX_GROUPS):
        block = values.get(f"{WIDEN_BLOCK}{n}")
        if block is None:
            continue
        chosen = block.get(WIDEN_INPUT) if isinstance(block, dict) else None
        selected = chosen.get("selected_options") if isinstance(chosen, dict) else None
        if selected is None:
            continue
        if not isinstance(selected, list) or len(selected) > OPTIONS_PER_GROUP:
            return None
        for option in selected:
            value = option.get("value") if isinstance(option, dict) else None
            index = option_index(value, n)
            if index is None or index >= len(names):
                return None
            widened.add(names[index])
    return widened


def option_index(value: Any, group: int) -> int | None:
    """The argument an option value ("group:i") stands for, within its group; None if it
    is not one of this group's."""
    if not isinstance(value, str) or len(value) > 8:
        return None
    head, _, tail = value.partition(":")
    if head != str(group) or not (tail.isascii() and tail.isdigit()):
        return None
    i = int(tail)
    return group * OPTIONS_PER_GROUP + i if i < OPTIONS_PER_GROUP else None


def covered_message(requests: list[ApprovalRequest], grants: Mapping[str, Grant]) -> Message:
    """The compact note in the thread for writes a grant approved: one line each."""
    lines = []
    for request in requests[:10]:
        grant = grants.get(request.grant_id)
        args = json.dumps(request.args, ensure_ascii=False, default=str)
        lines.append(
            m.COVERED_LINE.format(
                tool=escape(request.tool),
                args=code(cut(" ".join(args.split()), 150)),
                user=mention(request.decided_by),
                scope=escape(grant.scope if grant else "?"),
                until=clock(grant.expires_at) if grant else "?",
            )
        )
    return Message(text=m.COVERED_FALLBACK.format(count=len(requests)), blocks=[context(*lines)])


def constraint_text(grant: Grant) -> str:
    parts = [f"{escape(n)}={code(shown(v))}" for n, v in list(grant.constraint.fixed.items())[:4]]
    if len(grant.constraint.fixed) > 4:
        parts.append("…")
    if grant.constraint.any:
        names = ", ".join(escape(n) for n in grant.constraint.any[:6])
        parts.append(m.HOME_GRANT_ANY.format(names=names))
    return cut(", ".join(parts), 600)


def home_grants(grants: list[Grant], in_force: frozenset[str]) -> list[dict[str, Any]]:
    """App Home's "Allowed for you": live grants covering the person or made by them, each
    with a Revoke button (checked again on click: bot/listeners/grants.py)."""
    blocks: list[dict[str, Any]] = [divider(), section(f"*{m.HOME_GRANTS}*")]
    if not grants:
        return [*blocks, context(m.HOME_GRANTS_NONE)]
    for grant in grants[:HOME_GRANTS_SHOWN]:
        text = m.HOME_GRANT_LINE.format(
            tool=escape(grant.tool),
            requester=mention(grant.requester),
            grantor=mention(grant.grantor),
            where=m.GRANT_WHERE.get(grant.scope, grant.scope).split(",")[0],
            constraint=constraint_text(grant),
            until=date(grant.expires_at),
            uses=grant.uses,
        )
        if grant.id not in in_force:
            text += m.HOME_GRANT_LAPSED
        block = section(text)
        block["accessory"] = button(m.REVOKE, REVOKE_GRANT, grant.id, style="danger")
        blocks.append(block)
    return blocks
