"""An Edit keeps the arguments a tool's schema allows but does not list
(`additionalProperties: true`, as MCP servers may publish) and names them in the modal:
dropping them would run a different call than the one the approver read (before the fix, a
`dry_run: true` on the card was silently removed and a real deploy ran)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from approvals import ApprovalStatus
from bot.render import messages as m
from bot.render.blocks import APPROVE, EDIT
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention
from tests.support.runtime import wait_until
from tests.support.slack_bot import (
    ALICE,
    CHANNEL,
    SUPPORT,
    BotEnv,
    bot_env,
    buttons,
    has_button,
    texts,
)
from tests.test_bot_edit import form, submit, text
from tools import register_tool
from tools.registry import registry

POLICY = """\
roles:
  support: ["@support-team"]
tools:
  deploy_service:
    allow: [everyone]
    approvers: [support]
defaults:
  read: {allow: [everyone]}
"""


@pytest.fixture
def deployed() -> Iterator[list[dict[str, Any]]]:
    ran: list[dict[str, Any]] = []

    def deploy(ctx: object, args: dict[str, Any]) -> str:
        ran.append(dict(args))
        return "deployed"

    register_tool(
        name="deploy_service",
        description="Deploy a service.",
        parameters={
            "type": "object",
            "properties": {"service": {"type": "string"}},
            "required": ["service"],
            "additionalProperties": True,
        },
        handler=deploy,
        effect="write",
    )
    try:
        yield ran
    finally:
        registry.unregister("deploy_service")


@pytest.fixture
def env(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path, deployed: list
) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY) as bot:
        yield bot


def test_an_edit_keeps_and_names_the_arguments_the_schema_does_not_list(
    env: BotEnv, model_server: FakeOpenAI, deployed: list[dict[str, Any]]
) -> None:
    call = Turn(tool_calls=[("deploy_service", {"service": "web", "dry_run": True})])
    model_server.route("deploy", [call, "done"])
    env.event(app_mention("<@UBOT> deploy web (dry run)", user=ALICE))
    env.wait_for_runs(1)
    env.work()
    card = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
    approval_id = buttons(card["blocks"])[APPROVE]
    ts = env.rt.approvals.get(approval_id).cards[0]["ts"]

    env.click(EDIT, approval_id, SUPPORT, channel=CHANNEL, message_ts=ts)
    view = env.slack.wait_for_call("views.open")["view"]
    assert [b["label"]["text"] for b in view["blocks"] if b["type"] == "input"] == ["service"]
    assert m.EDIT_UNLISTED.format(names="dry_run") in texts(view["blocks"])
    assert submit(env, view, SUPPORT, form(view, service=text("web-canary"))) is None
    wait_until(lambda: env.rt.approvals.get(approval_id).status == ApprovalStatus.APPROVED)
    assert env.rt.approvals.get(approval_id).args == {"service": "web-canary", "dry_run": True}

    env.work()
    assert deployed == [{"service": "web-canary", "dry_run": True}]
