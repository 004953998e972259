"""A run's events in words for Slack's run view: one renderer per kind.

Every value that came from the model, a tool or a person is escaped (`escape`, `one_line`,
`code`); user ids become mentions only when shaped like one (`mention`). A kind missing from
`RENDERERS` (one an older or newer version wrote) still shows: as an ending when it reads
like one (`run_…`), else by its name (`generic`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bot.render import messages as m
from bot.render.mrkdwn import code, cut, escape, mention, one_line
from worker.events import GENERIC_KINDS, Event, EventKind, is_run_end

Render = Callable[[Event, str], str]  # (event, its offset from the run's start) -> mrkdwn


def event_line(event: Event, start: float) -> str:
    """One event in words ("" for one the view does not show)."""
    offset = f"{max(0.0, event.at - start):.2f}s"
    render = RENDERERS.get(event.kind)
    if render is None:
        render = ended if is_run_end(event.kind) else generic
    return render(event, offset)


def short_code(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return code(cut(" ".join(text.split()), limit))


def generic(event: Event, offset: str) -> str:
    return m.EVENT_OTHER.format(offset=offset, kind=escape(event.kind.replace("_", " ")))


def hidden(event: Event, offset: str) -> str:
    return ""


def asked(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_ASKED.format(
        offset=offset,
        user=mention(str(d.get("user", ""))),
        question=one_line(str(d.get("question", "")), 500),
    )


def model_call(event: Event, offset: str) -> str:
    d = event.data
    lines = [
        m.EVENT_MODEL.format(
            offset=offset,
            step=d.get("step"),
            finish=escape(str(d.get("finish_reason"))),
            tokens=int(d.get("prompt_tokens") or 0) + int(d.get("completion_tokens") or 0),
            cost=float(d.get("cost") or 0.0),
            seconds=float(d.get("seconds") or 0.0),
        )
    ]
    if d.get("content"):
        lines.append(m.EVENT_MODEL_SAYS.format(content=one_line(str(d["content"]), 500)))
    for call in d.get("calls") or []:
        lines.append(
            m.EVENT_MODEL_CALL.format(
                tool=escape(str(call.get("name", ""))),
                args=short_code(call.get("arguments", ""), 300),
            )
        )
    return "\n".join(lines)


def model_call_started(event: Event, offset: str) -> str:
    d = event.data
    attempt = ""
    if d.get("attempt", 1) != 1:
        attempt = m.EVENT_MODEL_ATTEMPT.format(attempt=d.get("attempt"), attempts=d.get("attempts"))
    return m.EVENT_MODEL_STARTED.format(
        offset=offset, step=d.get("step"), attempt=escape(attempt), deadline=d.get("deadline")
    )


def model_attempt_failed(event: Event, offset: str) -> str:
    d = event.data
    tokens = int(d.get("prompt_tokens") or 0) + int(d.get("completion_tokens") or 0)
    cost = m.EVENT_TOKENS.get(str(d.get("tokens")), "")
    return m.EVENT_MODEL_FAILED.format(
        offset=offset,
        attempt=d.get("attempt"),
        attempts=d.get("attempts"),
        error=one_line(str(d.get("error", "")), 300),
        tokens=cost.format(n=tokens),
    )


def tool_result(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_RESULT.format(
        offset=offset,
        tool=escape(str(d.get("tool"))),
        mark=m.EVENT_RESULT_OK if d.get("ok") else m.EVENT_RESULT_ERROR,
        result=one_line(str(d.get("result", "")), 600),
    )


def tool_denied(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_DENIED.format(
        offset=offset, tool=escape(str(d.get("tool"))), why=one_line(str(d.get("why")), 400)
    )


def tool_invalid(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_INVALID.format(
        offset=offset,
        tool=escape(str(d.get("tool"))),
        error=one_line(str(d.get("error")), 400),
    )


def approval_requested(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_APPROVAL.format(
        offset=offset,
        tool=escape(str(d.get("tool"))),
        args=short_code(d.get("args"), 400),
        approvers=escape(str(d.get("approvers", ""))),
    )


def approval_decided(event: Event, offset: str) -> str:
    d = event.data
    reason = f": {one_line(str(d['reason']), 300)}" if d.get("reason") else ""
    if d.get("changes"):
        changed = "; ".join(
            f"{c.get('field')}: {c.get('old')} -> {c.get('new')}"
            for c in d["changes"]
            if isinstance(c, dict)
        )
        reason += m.EVENT_EDITED.format(changes=one_line(changed, 600))
    if d.get("instructions"):
        reason += m.EVENT_INSTRUCTIONS.format(text=one_line(str(d["instructions"]), 600))
    return m.EVENT_DECIDED.format(
        offset=offset,
        status=escape(str(d.get("status"))),
        user=mention(str(d.get("by", ""))),
        reason=reason,
    )


def grant_created(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_GRANTED.format(
        offset=offset,
        user=mention(str(d.get("by", ""))),
        tool=escape(str(d.get("tool", ""))),
        scope=escape(str(d.get("scope", ""))),
        any=escape(", ".join(str(n) for n in d.get("any") or []) or "nothing else"),
        grant_id=escape(str(d.get("grant_id", ""))),
    )


def approval_covered(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_COVERED.format(
        offset=offset,
        tool=escape(str(d.get("tool", ""))),
        args=short_code(d.get("args"), 300),
        user=mention(str(d.get("by", ""))),
        grant_id=escape(str(d.get("grant_id", ""))),
    )


def connection_needed(event: Event, offset: str) -> str:
    d = event.data
    tool, provider = escape(str(d.get("tool", ""))), escape(str(d.get("provider", "")))
    more = d.get("more_access")
    if isinstance(more, list) and more:
        scopes = code(cut(" ".join(map(str, more)), 200))
        return m.EVENT_MORE_ACCESS.format(
            offset=offset, tool=tool, provider=provider, scopes=scopes
        )
    return m.EVENT_CONNECT_NEEDED.format(offset=offset, tool=tool, provider=provider)


def approval_expired(event: Event, offset: str) -> str:
    return m.EVENT_EXPIRED.format(offset=offset, tool=escape(str(event.data.get("tool"))))


def decision_refused(event: Event, offset: str) -> str:
    return m.EVENT_REFUSED.format(offset=offset, user=mention(str(event.data.get("by", ""))))


def demo_saved(event: Event, offset: str) -> str:
    d = event.data
    return m.EVENT_DEMO_SAVED.format(
        offset=offset,
        demo_id=escape(str(d.get("demo", ""))),
        user=mention(str(d.get("by", ""))),
    )


def cancel_requested(event: Event, offset: str) -> str:
    return m.EVENT_CANCEL.format(offset=offset, user=mention(str(event.data.get("by", ""))))


def ungrounded(event: Event, offset: str) -> str:
    """`ungrounded_facts`, and `ungrounded_numbers` of older logs (numbers only)."""
    facts = ", ".join(str(f) for f in ungrounded_facts(event.data))
    return m.EVENT_UNGROUNDED.format(offset=offset, facts=one_line(facts, 400))


def ungrounded_facts(data: dict[str, Any]) -> list[Any]:
    return [f for key in ("numbers", "identifiers", "names") for f in data.get(key) or []]


def write_reconciled(event: Event, offset: str) -> str:
    return m.EVENT_WRITE_RECONCILED.format(offset=offset, tool=escape(str(event.data.get("tool"))))


def write_unknown(event: Event, offset: str) -> str:
    return m.EVENT_WRITE_UNKNOWN.format(offset=offset, tool=escape(str(event.data.get("tool"))))


def ended(event: Event, offset: str) -> str:
    reason = event.data.get("reason")
    text = m.REASONS.get(str(reason), escape(str(reason))) if reason else ""
    return m.EVENT_END.format(
        offset=offset, status=escape(event.kind[4:]), why=f": {text}" if text else ""
    )


K = EventKind

# Not shown: the view says it elsewhere (its status, its demonstrations) or the result follows.
HIDDEN: frozenset[EventKind] = frozenset({K.SUSPENDED, K.DEMOS_SELECTED, K.WRITE_STARTED})

# Shown by name only ("`+1.20s` roles changed"), deliberately: `switchboard runs show` has
# the details for those who need them.
GENERIC = GENERIC_KINDS

RENDERERS: dict[str, Render] = {
    K.RUN_CREATED: asked,
    K.MODEL_CALL: model_call,
    K.MODEL_CALL_STARTED: model_call_started,
    K.MODEL_ATTEMPT_FAILED: model_attempt_failed,
    K.TOOL_RESULT: tool_result,
    K.TOOL_DENIED: tool_denied,
    K.TOOL_INVALID: tool_invalid,
    K.APPROVAL_REQUESTED: approval_requested,
    K.APPROVAL_DECIDED: approval_decided,
    K.APPROVAL_EXPIRED: approval_expired,
    K.GRANT_CREATED: grant_created,
    K.APPROVAL_COVERED: approval_covered,
    K.CONNECTION_NEEDED: connection_needed,
    K.DECISION_REFUSED: decision_refused,
    K.DEMO_CANDIDATE_SAVED: demo_saved,
    K.CANCEL_REQUESTED: cancel_requested,
    K.UNGROUNDED_FACTS: ungrounded,
    K.UNGROUNDED_NUMBERS: ungrounded,
    K.WRITE_RECONCILED: write_reconciled,
    K.WRITE_UNKNOWN: write_unknown,
    K.RUN_COMPLETED: ended,
    K.RUN_PARTIAL: ended,
    K.RUN_FAILED: ended,
    **dict.fromkeys(HIDDEN, hidden),
}
