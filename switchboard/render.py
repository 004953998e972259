"""Terminal text for runs and their events (the CLI and the console share it)."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable
from typing import Any

from worker.events import GENERIC_KINDS, Event, EventKind, is_run_end
from worker.run import Run

REASONS = {
    "max_steps": "it reached the step limit",
    "deadline": "it ran out of time",
    "tokens": "it reached the token budget",
    "cost": "it reached the cost budget",
    "tool_calls": "it reached the tool-call limit",
    "repeated_call": "the model repeated a call it had already made",
    "cancelled": "it was cancelled",
    "length": "the model's reply was cut off",
    "content_filter": "the model's reply was filtered",
    "refused": "the model refused",
    "model_error": "the model call failed",
    "internal_error": "an internal error stopped it",
}


_ENTITY = re.compile(r"<([^<>\n]+)>")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# Slack's emphasis (and Markdown's double form): markers at word edges, never inside a word,
# so snake_case names and arithmetic like 2*3*4 are left alone.
_EMPHASIS = [
    re.compile(r"(?<![\w*])\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*(?![\w*])"),
    re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"),
    re.compile(r"(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])"),
    re.compile(r"(?<![\w~])~(?=\S)([^~\n]+?)(?<=\S)~(?![\w~])"),
]


def plain(text: str) -> str:
    """Slack markup as a terminal shows it: `<@U1>` is @U1, `<#C1|general>` #general,
    `<https://x|docs>` "docs (https://x)", *bold* and _italic_ lose their markers, and
    `&lt;` `&gt;` `&amp;` are the characters again. Code spans are left as written."""
    parts = re.split(r"(```.*?```|`[^`\n]*`)", text, flags=re.DOTALL)
    for n in range(0, len(parts), 2):  # even parts are outside code
        part = _ENTITY.sub(_entity, parts[n])
        for pattern in _EMPHASIS:
            part = pattern.sub(r"\1", part)
        parts[n] = part
    return html.unescape("".join(parts)) if "&" in text else "".join(parts)


def _entity(match: re.Match[str]) -> str:
    target, _, label = match.group(1).partition("|")
    if target.startswith("@"):
        return "@" + (label.lstrip("@") or target[1:])
    if target.startswith("#"):
        return "#" + (label.lstrip("#") or target[1:])
    if target.startswith("!"):
        return label or "@" + target[1:].split("^")[0]
    if _SCHEME.match(target):
        shown = target.removeprefix("mailto:")
        return f"{label} ({shown})" if label and label != shown else shown
    return match.group(0)  # not markup: a literal "<...>" the model wrote


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_line(run: Run) -> str:
    reason = f" ({run.reason.value})" if run.reason else ""
    return (
        f"{run.id}  {when(run.created_at)}  {run.status.value + reason:<28} "
        f"{run.requester.user_id:<12} {short(run.question, 60)}"
    )


Render = Callable[[Event, str], list[str]]  # (event, its offset from the run's start) -> lines


def event_line(event: Event, start: float) -> list[str]:
    """One event as one or more lines: what happened, with its figures. A kind missing from
    `RENDERERS` (one an older or newer version wrote) still shows: as an ending when it reads
    like one (`run_…`), else by its name and data (`generic`)."""
    offset = f"+{event.at - start:7.2f}s"
    render = RENDERERS.get(event.kind)
    if render is None:
        render = ended if is_run_end(event.kind) else generic
    return render(event, offset)


def generic(event: Event, offset: str) -> list[str]:
    extra = f" {short(event.data, 300)}" if event.data else ""
    return [f"{offset}  {event.kind.replace('_', ' ')}{extra}"]


def asked(event: Event, offset: str) -> list[str]:
    d = event.data
    return [f"{offset}  asked by {d.get('user')}: {short(d.get('question'), 200)}"]


def model_call(event: Event, offset: str) -> list[str]:
    d = event.data
    head = (
        f"{offset}  model step {d.get('step')}: {d.get('finish_reason')}  "
        f"tokens {d.get('prompt_tokens')}+{d.get('completion_tokens')}  "
        f"${d.get('cost', 0):.6f}  {d.get('seconds', 0):.2f}s"
    )
    lines = [head]
    if d.get("content"):
        lines.append(f"            says: {short(plain(d['content']), 400)}")
    lines += [
        f"            → {c['name']}({short(c['arguments'], 300)})" for c in d.get("calls", [])
    ]
    return lines


def model_call_started(event: Event, offset: str) -> list[str]:
    d = event.data
    attempt = (
        f", attempt {d.get('attempt')} of {d.get('attempts')}" if d.get("attempt", 1) != 1 else ""
    )
    return [
        f"{offset}  asking the model: step {d.get('step')}{attempt}, "
        f"{d.get('deadline')} s for the step, at most {d.get('max_tokens')} tokens"
    ]


def model_attempt_failed(event: Event, offset: str) -> list[str]:
    d = event.data
    tokens = {
        "reported": f"; {spent_tokens(d)} tokens",
        "estimated": f"; about {spent_tokens(d)} tokens (estimated from what it streamed)",
        "unknown": "; tokens unknown (the server never said)",
    }.get(str(d.get("tokens")), "")
    return [
        f"{offset}  model attempt {d.get('attempt')} of {d.get('attempts')} failed after "
        f"{float(d.get('seconds') or 0):.1f}s: {short(d.get('error'), 300)}{tokens}"
    ]


def spent_tokens(data: dict[str, Any]) -> int:
    return int(data.get("prompt_tokens") or 0) + int(data.get("completion_tokens") or 0)


def tool_result(event: Event, offset: str) -> list[str]:
    d = event.data
    mark = "ok" if d.get("ok") else "error"
    cut = " [truncated]" if d.get("truncated") else ""
    return [f"{offset}  {d.get('tool')} {mark}{cut}: {short(d.get('result'), 400)}"]


def tool_denied(event: Event, offset: str) -> list[str]:
    d = event.data
    return [f"{offset}  DENIED {d.get('tool')}: {short(d.get('why'), 300)}"]


def tool_invalid(event: Event, offset: str) -> list[str]:
    d = event.data
    return [f"{offset}  INVALID {d.get('tool')}: {short(d.get('error'), 300)}"]


def approval_requested(event: Event, offset: str) -> list[str]:
    d = event.data
    return [
        f"{offset}  approval {d.get('approval_id')} requested for {d.get('tool')}"
        f"({short(d.get('args'), 300)}); may decide: {d.get('approvers')}"
    ]


def approval_decided(event: Event, offset: str) -> list[str]:
    d = event.data
    reason = f": {plain(d['reason'])}" if d.get("reason") else ""
    return [f"{offset}  {d.get('status')} by {d.get('by')}{reason} ({d.get('approval_id')})"]


def grant_created(event: Event, offset: str) -> list[str]:
    d = event.data
    widened = ", ".join(str(n) for n in d.get("any") or []) or "nothing else"
    return [
        f"{offset}  grant {d.get('grant_id')} by {d.get('by')}: similar {d.get('tool')} calls "
        f"allowed ({d.get('scope')}; any {widened}; until {when(float(d.get('expires_at') or 0))})"
    ]


def approval_covered(event: Event, offset: str) -> list[str]:
    d = event.data
    return [
        f"{offset}  approved by grant {d.get('grant_id')} of {d.get('by')}: "
        f"{d.get('tool')}({short(d.get('args'), 300)}) ({d.get('approval_id')})"
    ]


def connection_needed(event: Event, offset: str) -> list[str]:
    d = event.data
    more = d.get("more_access")
    if isinstance(more, list) and more:
        return [
            f"{offset}  {d.get('tool')} not run: {d.get('provider')} acts as the person "
            f"asking, whose connection does not give {short(' '.join(map(str, more)), 200)}"
        ]
    return [
        f"{offset}  {d.get('tool')} not run: {d.get('provider')} acts as the person asking, "
        "who has not connected it"
    ]


def approval_expired(event: Event, offset: str) -> list[str]:
    return [f"{offset}  approval {event.data.get('approval_id')} expired (denied)"]


def demos_selected(event: Event, offset: str) -> list[str]:
    d = event.data
    scores = d.get("scores")
    scores = scores if isinstance(scores, dict) else {}
    shown = [f"{i} {score(scores.get(i))}".strip() for i in d.get("demos", [])]
    line = f"{offset}  demonstrations: {', '.join(shown) or 'none'}"
    best = d.get("rejected")
    if isinstance(best, dict):
        line += f"; best left out: {best.get('id')} {score(best.get('score'))}: {best.get('why')}"
    return [line]


def score(value: Any) -> str:
    """A selection score as `demos_selected` records it ("" for none: older logs)."""
    return f"({value:.2f})" if isinstance(value, int | float) else ""


def suspended(event: Event, offset: str) -> list[str]:
    waiting = len(event.data.get("approvals", []))
    return [f"{offset}  waiting for {waiting} decision(s); no worker held"]


def ungrounded(event: Event, offset: str) -> list[str]:
    """`ungrounded_facts`, and `ungrounded_numbers` of older logs (numbers only)."""
    d = event.data
    kinds = [(k, d.get(k) or []) for k in ("numbers", "identifiers", "names")]
    found = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in kinds if v)
    return [f"{offset}  UNGROUNDED: not in any tool result or the question: {found}"]


def grounding_note(run: Run) -> str:
    """The line under an answer whose facts no source has ("" when none, or not checked)."""
    if not run.ungrounded:
        return ""
    return (
        "[check: not found in any tool result or the question: "
        + ", ".join(short(f, 80) for f in run.ungrounded[:10])
        + "]"
    )


def decision_refused(event: Event, offset: str) -> list[str]:
    return [f"{offset}  decision by {event.data.get('by')} refused: not an approver"]


def cancel_requested(event: Event, offset: str) -> list[str]:
    return [f"{offset}  cancel requested by {event.data.get('by')}"]


def demo_saved(event: Event, offset: str) -> list[str]:
    d = event.data
    return [f"{offset}  saved as candidate demonstration {d.get('demo')} by {d.get('by')}"]


def write(event: Event, offset: str) -> list[str]:
    d = event.data
    return [f"{offset}  {event.kind.replace('_', ' ')}: {d.get('tool')} ({d.get('approval_id')})"]


def ended(event: Event, offset: str) -> list[str]:
    d = event.data
    reason = str(d.get("reason") or "")
    why = f" — {REASONS.get(reason, reason)}: {plain(str(d.get('detail')))}" if reason else ""
    return [f"{offset}  {event.kind[4:].upper()}{why}"]


K = EventKind

# Shown by name with their data as JSON, deliberately: an operator reads it whole.
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
    K.DEMOS_SELECTED: demos_selected,
    K.SUSPENDED: suspended,
    K.UNGROUNDED_FACTS: ungrounded,
    K.UNGROUNDED_NUMBERS: ungrounded,
    K.DECISION_REFUSED: decision_refused,
    K.CANCEL_REQUESTED: cancel_requested,
    K.DEMO_CANDIDATE_SAVED: demo_saved,
    K.WRITE_STARTED: write,
    K.WRITE_RECONCILED: write,
    K.WRITE_UNKNOWN: write,
    K.RUN_COMPLETED: ended,
    K.RUN_PARTIAL: ended,
    K.RUN_FAILED: ended,
}


def trajectory(run: Run, events: list[Event], trace: str = "") -> str:
    """`trace`: the run's trace, as a link (SWITCHBOARD_TRACE_URL) or its id."""
    start = run.created_at
    u = run.usage
    lines = [
        f"Run {run.id}: {run.status.value}"
        + (f" ({REASONS.get(run.reason.value, run.reason.value)})" if run.reason else ""),
        f"Asked by {run.requester.user_id} in {run.requester.channel_id or '-'} at "
        f"{when(run.created_at)}; roles: {', '.join(run.requester.roles) or '-'}",
        f"Model: {run.model or '-'}   Profile: {run.profile.name if run.profile else 'none'}"
        f"   Demonstrations: {', '.join(run.demos) or 'none'}"
        f"   Policy: {run.policy_version or '-'}",
        f"Question: {run.question}",
        *([f"Trace: {trace}"] if trace else []),
        "",
    ]
    for event in events:
        lines += event_line(event, start)
    lines.append("")
    lines += grants_used(events)
    if run.answer:
        lines += ["Answer:", plain(run.answer)]
        lines += [note for note in (grounding_note(run),) if note] + [""]
    if run.detail and run.status.value != "completed":
        lines.append(f"Why it ended: {plain(run.detail)}")
    elapsed = (run.ended_at or time.time()) - run.created_at
    lines.append(
        f"Totals: {u.steps} steps, {u.tool_calls} tool calls, {u.tokens} tokens "
        f"({u.prompt_tokens} in / {u.completion_tokens} out), ${u.cost:.6f}, "
        f"{u.active_seconds:.2f}s working, {elapsed:.2f}s elapsed"
    )
    return "\n".join(lines)


def grants_used(events: list[Event]) -> list[str]:
    """Which standing grants approved calls of the run, by whom, how many calls each."""
    used: dict[tuple[str, str], int] = {}
    for event in events:
        if event.kind == EventKind.APPROVAL_COVERED:
            key = (str(event.data.get("grant_id")), str(event.data.get("by")))
            used[key] = used.get(key, 0) + 1
    if not used:
        return []
    lines = ["Grants used:"]
    lines += [f"  {grant} (granted by {by}): {n} call(s)" for (grant, by), n in used.items()]
    return [*lines, ""]


def run_json(run: Run, events: list[Event]) -> str:
    return json.dumps(
        {
            "run": json.loads(run.to_json()),
            "events": [{"id": e.id, "at": e.at, "kind": e.kind, **e.data} for e in events],
        },
        indent=2,
        ensure_ascii=False,
    )
