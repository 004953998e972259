"""Driving standing grants through the Slack fakes, as a person would: a write tool of the
test's own (`file_note`, counted in FILED), a policy offering grants for it, clicks on a
card's "Approve and allow…" and submissions of its modal. For tests/test_bot_grants.py and
bench/bench_grant_clicks.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bot.render.blocks import APPROVE
from bot.render.grants import GRANT_MODAL, WIDEN_BLOCK, WIDEN_INPUT, grant_action
from tests.fakes.openai_server import Turn
from tests.fakes.slack_server import app_mention, view_submission
from tests.support.slack_bot import ALICE, CHANNEL, SUPPORT, BotEnv, buttons
from tools import register_tool
from tools.registry import registry

POLICY = """\
roles:
  admins: [UADMIN]
  support: ["@support-team"]
admins: [admins]
tools:
  file_note:
    allow: [everyone]
    approvers: [support]
    self_approval: false
    grants: [thread, hour]
  create_ticket:
    allow: [everyone]
    approvers: [support]
    self_approval: false
    high_risk: true
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""

NOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"project": {"type": "string"}, "title": {"type": "string"}},
    "required": ["project", "title"],
}
FILED: list[dict[str, Any]] = []  # what file_note ran with, in this process (SimpleWorker)


def file_note(ctx: Any, args: dict[str, Any]) -> str:
    FILED.append(dict(args))
    return f"filed {args['title']}"


def declare_note(schema: dict[str, Any]) -> None:
    registry.unregister("file_note")
    register_tool(
        name="file_note",
        description="File a note in a project.",
        parameters=schema,
        effect="write",
        handler=file_note,
    )


def to_user(user: str) -> Callable[[dict[str, Any]], bool]:
    return lambda args: bool(args["user"] == user)


def note(title: str, project: str = "IT") -> Turn:
    return Turn(tool_calls=[("file_note", {"project": project, "title": title})])


def cards(env: BotEnv) -> list[dict[str, Any]]:
    return [
        c for c in env.slack.calls("chat.postMessage") if APPROVE in buttons(c.get("blocks") or [])
    ]


def ask(env: BotEnv, text: str, thread_ts: str | None = None) -> dict[str, Any]:
    """Mention the bot (in a thread, with `thread_ts`) and run the worker until it rests."""
    before = len(env.runs())
    mention = app_mention(f"<@UBOT> {text}", user=ALICE, thread_ts=thread_ts)
    env.event(mention)
    env.wait_for_runs(before + 1)
    env.work()
    return mention


def card_for(env: BotEnv, count: int) -> tuple[str, str, dict[str, Any]]:
    """The `count`th card posted: (approval id, its ts, its blocks)."""
    posted: dict[str, Any] = env.slack.wait_for(
        lambda: cards(env)[count - 1] if len(cards(env)) >= count else None
    )
    approval_id = buttons(posted["blocks"])[APPROVE]
    stored = env.rt.approvals.get(approval_id).cards[0]
    return approval_id, stored["ts"], posted


def open_grant(
    env: BotEnv, approval_id: str, card_ts: str, thread_ts: str, scope: str, user: str
) -> dict[str, Any] | None:
    """Click "Approve and allow…"; the modal it opened, or None if none opened."""
    before = len(env.slack.calls("views.open"))
    env.click(
        grant_action(scope),
        approval_id,
        user,
        channel=CHANNEL,
        message_ts=card_ts,
        thread_ts=thread_ts,
    )
    env.settle()
    opened = env.slack.calls("views.open")[before:]
    return opened[0]["view"] if opened else None


def submit_grant(
    env: BotEnv, view: dict[str, Any], user: str, widen: list[str], names: list[str]
) -> Any:
    """Submit the grant modal with the arguments in `widen` ticked; Bolt's answer."""
    options = [{"value": f"0:{names.index(name)}"} for name in widen]
    values = {f"{WIDEN_BLOCK}0": {WIDEN_INPUT: {"type": "checkboxes", "selected_options": options}}}
    body = view_submission(
        GRANT_MODAL, values, user_id=user, private_metadata=view["private_metadata"]
    )
    response = env.post(body)
    assert response.status == 200, response
    env.settle()
    return response.json()


def grant_thread(env: BotEnv, approval_id: str, card_ts: str, thread_ts: str) -> None:
    view = open_grant(env, approval_id, card_ts, thread_ts, "thread", SUPPORT)
    assert view is not None and view["callback_id"] == GRANT_MODAL
    assert submit_grant(env, view, SUPPORT, ["title"], ["project", "title"]) is None  # no errors
    env.work()
