"""Bolt listeners. Each one acks at once (Bolt acks events before they run; the others call
`ack()` first), then does Redis work and enqueues. Slack Web API calls come only after the
ack; a run's progress is shown by the worker through `bot.outbound.slack_surface`.

Listeners get `sb` (a `Bot`: the runtime, identity, thread memory and surface) from the
request context, put there by `attach`, the first global middleware. `attach` also drops
repeated deliveries of an event (Slack retries, redeliveries): one run per event.

`attach` also refuses requests for a workspace or app the bot does not serve
(`bot.state.installations.Home`) and acks `app_rate_limited`, which Slack sends to every app.
Whatever no listener of ours claims is acked and logged by the catch-alls registered last
(`lifecycle`).

Every id a listener uses is checked for its shape first (`bot.transport.payloads`,
`bot.transport.ids`); a payload that lacks one is logged as malformed and dropped, never
half-handled. (The HTTP server has already refused bodies whose envelope Bolt itself could
not read: `bot.transport.envelope`.)

The package, by what Slack sends:
- `base`: the `Bot`, the `boundary` every listener runs inside, the click prelude, `tell`,
  deciding a request; who may do what is asked of `Bot.access`
- `questions`: mentions, DMs, thread replies (`ask`)
- `assistant`: assistant threads
- `actions`: buttons and modals (a card's, a run's), App Home (`home` builds it)
- `edit`: the Edit button and the Edit modal's submission
- `batch`: Approve all / Reject all on a batch card
- `grants`: "Approve and allow…" (standing grants), its modal, and Revoke in App Home
- `demos`: saving a run as a demonstration, from the run modal
- `commands`: the slash command
- `connections`: per-user connections: the code modal, App Home's Connect and Disconnect
- `lifecycle`: the installation going away, and the catch-alls
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import structlog
from slack_bolt import App, Assistant, BoltContext, BoltRequest, BoltResponse

from bot.listeners import (
    actions,
    assistant,
    batch,
    connections,
    edit,
    grants,
    lifecycle,
    questions,
)
from bot.listeners.base import Bot, boundary
from bot.listeners.commands import COMMAND, on_command
from bot.render.blocks import (
    APPROVE,
    APPROVE_ALL,
    CANCEL,
    EDIT,
    EDIT_MODAL,
    HOME_PAGE,
    REJECT,
    REJECT_ALL,
    REJECT_ALL_MODAL,
    REJECT_MODAL,
    SAVE_DEMO,
    SHOW_ARGS,
    VIEW_RUN,
)
from bot.render.connections import CODE_MODAL, CONNECT_START, DISCONNECT, ENTER_CODE
from bot.render.grants import GRANT, GRANT_MODAL, REVOKE_GRANT
from bot.transport import ids
from bot.transport.payloads import envelope_team

__all__ = ["COMMAND", "Bot", "attach", "boundary", "register"]

log = structlog.get_logger(__name__)

ANYTHING = re.compile(".*", re.DOTALL)


def register(app: App, sb: Bot) -> None:
    app.use(attach(sb))  # first: every listener below relies on it
    threads = Assistant()
    threads.thread_started(assistant.on_assistant_thread_started)
    threads.thread_context_changed(assistant.on_assistant_context_changed)
    threads.user_message(assistant.on_assistant_message)
    app.assistant(threads)
    app.event("app_mention")(questions.on_mention)
    app.event("message")(questions.on_message)
    app.event("app_home_opened")(actions.on_home_opened)
    app.action(APPROVE)(actions.on_approve)
    app.action(REJECT)(actions.on_reject)
    app.action(CANCEL)(actions.on_cancel)
    app.action(SHOW_ARGS)(actions.on_show_args)
    app.action(VIEW_RUN)(actions.on_view_run)
    app.action(SAVE_DEMO)(actions.on_save_demo)
    app.action(re.compile(f"^{HOME_PAGE}_(previous|next)$"))(actions.on_home_page)
    app.view(REJECT_MODAL)(actions.on_reject_submitted)
    app.action(EDIT)(edit.on_edit)
    app.action(APPROVE_ALL)(batch.on_decide_all)
    app.action(REJECT_ALL)(batch.on_decide_all)
    app.view(REJECT_ALL_MODAL)(batch.on_reject_all_submitted)
    app.view(EDIT_MODAL)(edit.on_edit_submitted)
    app.action(re.compile(f"^{GRANT}_[a-z]{{1,10}}$"))(grants.on_grant)
    app.view(GRANT_MODAL)(grants.on_grant_submitted)
    app.action(REVOKE_GRANT)(grants.on_revoke_grant)
    app.command(COMMAND)(on_command)
    app.action(ENTER_CODE)(connections.on_enter_code)
    app.view(CODE_MODAL)(connections.on_code_submitted)
    app.action(CONNECT_START)(connections.on_connect)
    app.action(DISCONNECT)(connections.on_disconnect)
    app.event("app_uninstalled")(lifecycle.on_installation_gone)
    app.event("tokens_revoked")(lifecycle.on_installation_gone)
    app.event("user_change")(lifecycle.on_user_change)
    # last: whatever the listeners above do not claim is acked here, never Bolt's 404
    app.event(ANYTHING)(lifecycle.on_other_event)
    app.action(ANYTHING)(lifecycle.on_other_interaction)
    app.view(ANYTHING)(lifecycle.on_other_interaction)
    app.view_closed(ANYTHING)(lifecycle.on_other_interaction)
    app.shortcut(ANYTHING)(lifecycle.on_other_interaction)
    app.options(ANYTHING)(lifecycle.on_other_options)
    app.command(ANYTHING)(lifecycle.on_other_command)


def attach(sb: Bot) -> Callable[..., BoltResponse | None]:
    def attach_bot(
        req: BoltRequest, body: dict[str, Any], context: BoltContext, next_: Callable[[], None]
    ) -> BoltResponse | None:
        context["sb"] = sb
        if body.get("type") == "app_rate_limited":  # sent to every app, subscribed or not
            log.warning("slack_events_rate_limited", minute=body.get("minute_rate_limited"))
            return BoltResponse(status=200, body="")
        refused = sb.home.refusal(body)
        if refused:  # signed by Slack, but for a workspace or app this bot does not serve
            team, enterprise = envelope_team(body)
            log.warning(
                "request_refused",
                why=refused,
                type=str(body.get("type"))[:40],
                team=team[:40],
                enterprise=enterprise[:40],
            )
            return BoltResponse(status=200, body="")
        if body.get("type") == "event_callback":
            event_id = ids.shaped(ids.EVENT, body.get("event_id"))
            if event_id is None:  # without an id it cannot be de-duplicated: not from Slack
                log.warning("event_unidentified")
                return BoltResponse(status=200, body="")
            if not sb.threads.claim_event(event_id):
                retry = (req.headers.get("x-slack-retry-num") or [""])[0]
                log.info("event_repeated", event_id=event_id, retry=retry)
                return BoltResponse(status=200, body="")
        next_()
        return None

    return attach_bot
