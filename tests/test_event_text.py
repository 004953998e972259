"""Every kind of run event renders on both surfaces (Slack's run view, `switchboard runs show`),
by its own renderer unless it is deliberately listed as shown generically; what the model or a
person wrote is escaped on Slack; kinds from other versions still show."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from bot.render import event_text as slack
from bot.render import messages as m
from switchboard import render as cli
from worker.eventlog import EventLog
from worker.events import Event, EventKind, is_run_end
from worker.run import RunStatus

START = 1000.0
ROOT = Path(__file__).resolve().parent.parent

# What each kind's writer records, with realistic values.
SAMPLES: dict[EventKind, dict[str, Any]] = {
    EventKind.RUN_CREATED: {
        "user": "UALICE",
        "channel": "CHELP",
        "roles": ["staff"],
        "question": "How many open tickets does the printer queue have?",
        "parent": None,
        "profile": "it-help",
    },
    EventKind.WAITING_IN_LINE: {"in_flight": 3},
    EventKind.DECISION_REFUSED: {"approval_id": "ap_1", "by": "UBOB"},
    EventKind.APPROVAL_DECIDED: {
        "approval_id": "ap_1",
        "tool": "create_ticket",
        "status": "approved",
        "by": "UCAROL",
        "reason": "fine, but file it for the 3rd floor",
        "edited": True,
        "changes": [{"field": "title", "old": "Printer jam", "new": "Printer jam, floor 3"}],
        "instructions": "mention the toner too",
    },
    EventKind.CANCEL_REQUESTED: {"by": "UALICE"},
    EventKind.CONNECTION_NEEDED: {"call_id": "call_1", "tool": "whoami", "provider": "github"},
    EventKind.HANDED_BACK: {"pid": 4242, "step": 3},
    EventKind.SUSPENDED: {"approvals": ["ap_1"]},
    EventKind.ROLES_UNAVAILABLE: {"error": "usergroups.list: ratelimited"},
    EventKind.ROLES_CHANGED: {"before": ["staff", "it-admins"], "after": ["staff"]},
    EventKind.POLICY_CHANGED: {"before": "0123456789ab", "after": "ba9876543210"},
    EventKind.MODEL_ERROR: {"error": "HTTP 503 from the model server", "timeout": 30.0},
    EventKind.MODEL_CALL_STARTED: {
        "step": 1,
        "attempt": 2,
        "attempts": 3,
        "deadline": 60.0,
        "max_tokens": 2048,
    },
    EventKind.MODEL_ATTEMPT_FAILED: {
        "step": 1,
        "attempt": 1,
        "attempts": 3,
        "error_kind": "timeout",
        "error": "the model sent nothing for 20 s",
        "seconds": 20.0,
        "prompt_tokens": 310,
        "completion_tokens": 95,
        "tokens": "estimated",
        "cost": 0.0,
    },
    EventKind.UNGROUNDED_NUMBERS: {"numbers": ["5000", "12.5"]},
    EventKind.UNGROUNDED_FACTS: {
        "numbers": ["39.99"],
        "identifiers": ["IT-4521"],
        "names": ["Amazon Web Services"],
        "verdict": "ungrounded",
    },
    EventKind.DEMOS_SELECTED: {
        "demos": ["printer-jam", "vpn-reset"],
        "scores": {"printer-jam": 0.61, "vpn-reset": 0.34},
        "rejected": {"id": "open-ticket", "score": 0.49, "why": "writes with create_ticket"},
    },
    EventKind.MODEL_CALL: {
        "step": 2,
        "pid": 4242,
        "finish_reason": "tool_calls",
        "prompt_tokens": 812,
        "completion_tokens": 41,
        "cost": 0.000431,
        "seconds": 1.204,
        "content": "I'll look the queue up first.",
        "calls": [{"id": "call_1", "name": "search_tickets", "arguments": '{"q": "printer"}'}],
    },
    EventKind.TOOL_INVALID: {
        "call_id": "call_1",
        "tool": "search_tickets",
        "error": "q: expected a string",
    },
    EventKind.REPEATED_CALL: {"call_id": "call_2", "tool": "search_tickets", "args": {"q": "x"}},
    EventKind.TOOL_DENIED: {
        "call_id": "call_1",
        "tool": "delete_ticket",
        "user": "UALICE",
        "why": "delete_ticket needs the it-admins role",
    },
    EventKind.APPROVAL_REQUESTED: {
        "approval_id": "ap_1",
        "call_id": "call_3",
        "tool": "create_ticket",
        "args": {"title": "Printer jam", "priority": "high"},
        "approvers": "@it-admins",
        "expires_at": START + 3600,
    },
    EventKind.RUN_COMPLETED: {
        "reason": None,
        "detail": "",
        "answer": "There are 4 open printer tickets.",
        "steps": 3,
        "tokens": 2400,
        "cost": 0.0012,
        "seconds": 4.2,
    },
    EventKind.RUN_PARTIAL: {
        "reason": "max_steps",
        "detail": "stopped after 10 steps",
        "answer": "",
        "steps": 10,
        "tokens": 9000,
        "cost": 0.004,
        "seconds": 20.5,
    },
    EventKind.RUN_FAILED: {
        "reason": "internal_error",
        "detail": "KeyError: 'q'",
        "answer": "",
        "steps": 1,
        "tokens": 800,
        "cost": 0.0004,
        "seconds": 1.1,
    },
    EventKind.WRITE_STARTED: {
        "approval_id": "ap_1",
        "call_id": "call_3",
        "tool": "create_ticket",
        "pid": 4242,
    },
    EventKind.WRITE_RECONCILED: {"approval_id": "ap_1", "tool": "create_ticket"},
    EventKind.WRITE_UNKNOWN: {"approval_id": "ap_1", "tool": "create_ticket"},
    EventKind.TOOL_RESULT: {
        "call_id": "call_1",
        "tool": "search_tickets",
        "args": {"q": "printer"},
        "ok": True,
        "truncated": False,
        "result": '[{"id": 7, "title": "Printer jam"}]',
        "approval_id": None,
    },
    EventKind.APPROVAL_EXPIRED: {"approval_id": "ap_1", "tool": "create_ticket"},
    EventKind.APPROVAL_REMINDED: {"approval_id": "ap_1", "tool": "create_ticket"},
    EventKind.APPROVAL_ESCALATED: {"approval_id": "ap_1", "to": ["@it-managers"]},
    EventKind.DEMO_CANDIDATE_SAVED: {"demo": "cand-printer-jam", "by": "UCAROL"},
    EventKind.EDIT_REFUSED: {
        "approval_id": "ap_1",
        "by": "UCAROL",
        "errors": {"a0": "priority must be one of low, high"},
    },
    EventKind.GRANT_CREATED: {
        "grant_id": "gr_1",
        "approval_id": "ap_1",
        "tool": "create_ticket",
        "by": "UCAROL",
        "scope": "thread",
        "any": ["title"],
        "fixed": ["project"],
        "expires_at": START + 3600,
    },
    EventKind.GRANT_REVOKED: {"grant_id": "gr_1", "by": "UALICE"},
    EventKind.APPROVAL_COVERED: {
        "approval_id": "ap_2",
        "call_id": "call_2",
        "tool": "create_ticket",
        "args": {"project": "IT", "title": "x"},
        "grant_id": "gr_1",
        "by": "UCAROL",
        "scope": "thread",
        "expires_at": START + 3600,
    },
}

# Markup a model, a tool or a person could write to ping, mention or forge a link.
HOSTILE = "<!channel> <@U0ADMIN> <https://evil.example|docs> & more"


def event(kind: str, data: dict[str, Any]) -> Event:
    return Event(id="1", at=START + 1.25, kind=kind, data=data)


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(EventKind)


@pytest.mark.parametrize("surface", [slack, cli], ids=["slack", "cli"])
def test_each_kind_has_a_renderer_or_is_deliberately_generic(surface: Any) -> None:
    hidden: frozenset[str] = getattr(surface, "HIDDEN", frozenset())
    assert not surface.GENERIC & set(surface.RENDERERS)
    assert set(surface.RENDERERS) | surface.GENERIC == set(EventKind)
    assert hidden <= set(surface.RENDERERS)


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_kind_renders_on_slack(kind: EventKind) -> None:
    shown = slack.event_line(event(kind, SAMPLES[kind]), START)
    generic = slack.generic(event(kind, SAMPLES[kind]), "1.25s")
    if kind in slack.HIDDEN:
        assert shown == ""
    elif kind in slack.GENERIC:
        assert shown == generic == m.EVENT_OTHER.format(offset="1.25s", kind=kind.replace("_", " "))
    else:
        assert shown.startswith("`+1.25s` ") and shown != generic


@pytest.mark.parametrize("kind", list(EventKind))
def test_every_kind_renders_in_the_terminal(kind: EventKind) -> None:
    lines = cli.event_line(event(kind, SAMPLES[kind]), START)
    generic = cli.generic(event(kind, SAMPLES[kind]), "+   1.25s")
    assert lines and lines[0].startswith("+   1.25s  ")
    if kind in cli.GENERIC:
        assert lines == generic
    else:
        assert lines != generic


def test_both_surfaces_show_the_details_of_what_the_other_shows() -> None:
    says = {k: slack.event_line(event(k, SAMPLES[k]), START) for k in EventKind}
    prints = {k: "\n".join(cli.event_line(event(k, SAMPLES[k]), START)) for k in EventKind}
    assert "5000, 12.5" in says[EventKind.UNGROUNDED_NUMBERS]
    assert "5000, 12.5" in prints[EventKind.UNGROUNDED_NUMBERS]
    for fact in ("39.99", "IT-4521", "Amazon Web Services"):
        assert fact in says[EventKind.UNGROUNDED_FACTS]
        assert fact in prints[EventKind.UNGROUNDED_FACTS]
    assert prints[EventKind.DEMOS_SELECTED].endswith(
        "demonstrations: printer-jam (0.61), vpn-reset (0.34); best left out: open-ticket "
        "(0.49): writes with create_ticket"
    )
    for kind in (EventKind.WRITE_RECONCILED, EventKind.WRITE_UNKNOWN):
        assert "*create_ticket*" in says[kind] and "create_ticket (ap_1)" in prints[kind]
    assert "outcome is unknown" in says[EventKind.WRITE_UNKNOWN]
    for shown in (says, prints):  # a retry, and what the failed attempt cost, and how known
        assert "attempt 2 of 3" in shown[EventKind.MODEL_CALL_STARTED]
        failed = shown[EventKind.MODEL_ATTEMPT_FAILED]
        assert "attempt 1 of 3 failed" in failed and "sent nothing for 20 s" in failed
        assert "about 405 tokens" in failed and "estimated" in failed
    assert prints[EventKind.CANCEL_REQUESTED].endswith("cancel requested by UALICE")
    assert "<@UALICE> asked to cancel" in says[EventKind.CANCEL_REQUESTED]
    assert prints[EventKind.DEMO_CANDIDATE_SAVED].endswith(
        "saved as candidate demonstration cand-printer-jam by UCAROL"
    )


def hostile(value: Any) -> Any:
    """`value` with HOSTILE added to every string in it (ids too: then they are no ids)."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, list):
        return [hostile(v) for v in value]
    if isinstance(value, dict):
        return {k: hostile(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        *SAMPLES.items(),
        ("run_cancelled", {"reason": "cancelled", "detail": "by UALICE"}),  # other versions
        ("<!here>_from_<b>elsewhere", {"detail": "x"}),
    ],
)
def test_what_the_model_or_a_person_wrote_is_escaped_on_slack(
    kind: str, data: dict[str, Any]
) -> None:
    shown = slack.event_line(event(kind, hostile(data)), START)
    assert "<" not in shown and ">" not in shown, shown
    assert not re.search(r"&(?!amp;|lt;|gt;)", shown), shown


def test_kinds_from_other_versions_still_render() -> None:
    future = event("queue_reshuffled", {"position": 2})
    assert slack.event_line(future, START) == "`+1.25s` queue reshuffled"
    assert cli.event_line(future, START) == ['+   1.25s  queue reshuffled {"position": 2}']
    ending = event("run_cancelled", {"reason": "cancelled", "detail": "by UALICE"})
    assert slack.event_line(ending, START) == "`+1.25s` *cancelled*: the run was cancelled"
    assert cli.event_line(ending, START) == ["+   1.25s  CANCELLED — it was cancelled: by UALICE"]


def test_a_run_ends_with_the_kind_named_for_its_status() -> None:
    for status in (RunStatus.COMPLETED, RunStatus.PARTIAL, RunStatus.FAILED):
        assert EventKind.ended(status) == f"run_{status.value}"
        assert is_run_end(EventKind.ended(status))
    assert not is_run_end(EventKind.RUN_CREATED) and not is_run_end("model_call")
    assert is_run_end("run_cancelled")  # written by another version: an ending still


def test_the_log_stores_a_kind_as_its_plain_string(redis_conn) -> None:
    log = EventLog(redis_conn)
    log.append("r1", EventKind.MODEL_CALL, step=1)
    [raw] = redis_conn.lrange(log.keys.events("r1"), 0, -1)
    assert json.loads(raw)["k"] == "model_call"
    [read] = log.read("r1")
    assert read.kind == EventKind.MODEL_CALL and type(read.kind) is str


def written_kinds() -> list[tuple[str, str]]:
    """(where, kind) for every `….events.append(run_id, kind, …)` in the code."""
    found = []
    for package in ("worker", "bot", "switchboard", "approvals", "tools"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "append"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "events"
                    and len(node.args) >= 2
                ):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append((where, ast.unparse(node.args[1])))
    return found


def test_every_kind_written_is_an_event_kind() -> None:
    written = written_kinds()
    assert len(written) > 20
    for where, kind in written:
        if kind.startswith(("'", '"')):  # a writer not converted yet (issue 13)
            assert ast.literal_eval(kind) in set(EventKind), where
        elif kind != "EventKind.ended(finish.status)":  # run_completed, run_partial, run_failed
            assert kind.removeprefix("EventKind.") in EventKind.__members__, (where, kind)
