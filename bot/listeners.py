"""Bolt listeners. Each one acks at once (Bolt acks events before they run; the others call
`ack()` first), then does Redis work and enqueues. Slack Web API calls come only after the
ack; a run's progress is shown by the worker through `bot.surface`.

Listeners get `sb` (a `Bot`: the runtime, identity, thread memory and surface) from the
request context, put there by `attach`, the first global middleware. `attach` also drops
repeated deliveries of an event (Slack retries, redeliveries): one run per event.

`attach` also refuses requests for a workspace or app the bot does not serve
(`bot.installations.Home`) and acks `app_rate_limited`, which Slack sends to every app.
Whatever no listener of ours claims (old buttons, shortcuts, views, events we do not
subscribe to) is acked and logged by the catch-alls registered last, so Bolt's 404
"unhandled request" never reaches Slack: failed deliveries count toward Slack turning the
event subscription off.

Every id a listener uses is checked for its shape first (`bot.ids`); a payload that lacks
one is logged as malformed and dropped, never half-handled. (The HTTP server has already
refused bodies whose envelope Bolt itself could not read: `bot.envelope`.)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec

import structlog
from slack_bolt import Ack, App, Assistant, BoltContext, BoltRequest, BoltResponse
from slack_bolt.context.set_status import SetStatus
from slack_bolt.context.set_suggested_prompts import SetSuggestedPrompts
from slack_bolt.context.set_title import SetTitle
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.webhook import WebhookClient

from approvals import ApprovalRequest
from approvals.store import INSTRUCTIONS_MAX
from bot import demos, ids
from bot import messages as m
from bot.blocks import (
    APPROVE,
    APPROVE_ALL,
    CANCEL,
    EDIT,
    EDIT_MODAL,
    HOME_PAGE,
    REJECT,
    REJECT_ALL,
    REJECT_INSTRUCTIONS_BLOCK,
    REJECT_INSTRUCTIONS_INPUT,
    REJECT_MODAL,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
    SAVE_DEMO,
    SHOW_ARGS,
    VIEW_RUN,
    outcome_text,
)
from bot.commands import parse, runs_listing
from bot.home import build_home
from bot.identity import Identity
from bot.installations import Home, Installations
from bot.mrkdwn import cut, escape
from bot.payloads import (
    Asked,
    Clicked,
    Question,
    Said,
    action_value,
    bot_mention,
    dig,
    envelope_team,
    interaction_id,
    question_text,
    read_metadata,
    team_of,
    user_team,
)
from bot.surface import SlackSurface
from bot.threads import Threads
from bot.views import args_modal, modal, reject_modal, run_modal
from worker import service
from worker.roles import RolesUnavailable
from worker.run import Run, RunStatus
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

P = ParamSpec("P")

COMMAND = "/switchboard"
REASON_MAX = 500
IN_FLIGHT = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL)
SCAN = 10_000  # in-flight runs and pending approvals looked at when an installation goes
ANYTHING = re.compile(".*", re.DOTALL)


@dataclass(frozen=True)
class Bot:
    rt: Runtime
    identity: Identity
    threads: Threads
    surface: SlackSurface
    home: Home
    installations: Installations


def register(app: App, sb: Bot) -> None:
    app.use(attach(sb))  # first: every listener below relies on it
    assistant = Assistant()
    assistant.thread_started(on_assistant_thread_started)
    assistant.thread_context_changed(on_assistant_context_changed)
    assistant.user_message(on_assistant_message)
    app.assistant(assistant)
    app.event("app_mention")(on_mention)
    app.event("message")(on_message)
    app.event("app_home_opened")(on_home_opened)
    app.action(APPROVE)(on_approve)
    app.action(REJECT)(on_reject)
    app.action(CANCEL)(on_cancel)
    app.action(SHOW_ARGS)(on_show_args)
    app.action(VIEW_RUN)(on_view_run)
    app.action(SAVE_DEMO)(on_save_demo)
    app.action(re.compile(f"^{HOME_PAGE}_(previous|next)$"))(on_home_page)
    app.view(REJECT_MODAL)(on_reject_submitted)
    from bot import batch, edit  # they use this module's helpers: imported once they exist

    app.action(EDIT)(boundary(edit.on_edit))
    app.action(APPROVE_ALL)(boundary(batch.on_decide_all))
    app.action(REJECT_ALL)(boundary(batch.on_decide_all))
    app.view(EDIT_MODAL)(boundary(edit.on_edit_submitted))
    app.command(COMMAND)(on_command)
    app.event("app_uninstalled")(on_installation_gone)
    app.event("tokens_revoked")(on_installation_gone)
    # last: whatever the listeners above do not claim is acked here, never Bolt's 404
    app.event(ANYTHING)(on_other_event)
    app.action(ANYTHING)(on_other_interaction)
    app.view(ANYTHING)(on_other_interaction)
    app.view_closed(ANYTHING)(on_other_interaction)
    app.shortcut(ANYTHING)(on_other_interaction)
    app.options(ANYTHING)(on_other_options)
    app.command(ANYTHING)(on_other_command)


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


def boundary(listener: Callable[P, None]) -> Callable[P, None]:
    """The listener boundary: log with the traceback; Slack already has its ack."""

    @functools.wraps(listener)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            listener(*args, **kwargs)
        except RolesUnavailable as exc:  # fail closed, and say why
            log.warning("roles_unavailable", listener=listener.__name__, error=str(exc))
            client, body = kwargs.get("client"), kwargs.get("body")
            if isinstance(client, WebClient) and isinstance(body, dict):
                explain_roles_unavailable(client, body)
        except Exception:  # boundary: nothing else would log it with our context
            log.exception("listener_failed", listener=listener.__name__)

    return guarded


def explain_roles_unavailable(client: WebClient, body: dict[str, Any]) -> None:
    """Tell the person who asked or clicked that nothing was done: their Slack user groups
    (which decide what they may do) could not be confirmed."""
    event = body.get("event")
    try:
        if isinstance(event, dict):
            user = ids.shaped(ids.USER, event.get("user"))
            channel = ids.shaped(ids.CHANNEL, event.get("channel"))
            if user and channel and event.get("type") != "app_home_opened":
                thread_ts = ids.shaped(ids.TS, event.get("thread_ts") or event.get("ts"))
                client.chat_postEphemeral(
                    channel=channel, user=user, text=m.ROLES_UNAVAILABLE, thread_ts=thread_ts
                )
            return
        clicked = Clicked.of(body)
        if clicked is not None:
            tell(client, clicked, m.ROLES_UNAVAILABLE)
        elif (user := ids.shaped(ids.USER, body.get("user_id"))) and (
            channel := ids.shaped(ids.CHANNEL, body.get("channel_id"))
        ):
            client.chat_postEphemeral(channel=channel, user=user, text=m.ROLES_UNAVAILABLE)
    except SlackApiError as exc:
        log.warning("roles_unavailable_not_told", error=str(exc)[:300])


# -- questions -----------------------------------------------------------------------------------


def ask(sb: Bot, client: WebClient, q: Question) -> Run | None:
    """Create the run (continuing the thread's conversation, if the bot answered there)."""
    requester = sb.identity.requester(q.user, q.user_team, q.channel)
    if not sb.identity.may_start(requester.roles):
        log.info("question_refused_external", user=q.user, team=q.user_team)
        if not q.overheard:
            say(client, q.channel, q.thread_ts, m.EXTERNAL_CANNOT_ASK)
        return None
    parent = None
    parent_id = sb.threads.last_run(q.channel, q.thread_ts)
    if parent_id:
        parent = sb.rt.store.find(parent_id)
        if parent is not None and not parent.status.terminal:
            say(client, q.channel, q.thread_ts, m.STILL_WORKING)
            return None
    origin = {
        "surface": "slack",
        "channel": q.channel,
        "thread_ts": q.thread_ts,
        "team": q.team,
        "event_id": q.event_id,
        "assistant": "1" if q.assistant else "",
    }
    try:
        run = service.submit(sb.rt, q.text, requester, origin=origin, parent=parent)
    except service.QuestionRejected as exc:
        say(client, q.channel, q.thread_ts, m.QUESTION_REJECTED.format(reason=escape(str(exc))))
        return None
    sb.threads.remember(q.channel, q.thread_ts, run.id)
    log.info("run_submitted", run_id=run.id, user=q.user, channel=q.channel, parent=parent_id)
    return run


def say(client: WebClient, channel: str, thread_ts: str | None, text: str) -> None:
    client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)


@boundary
def on_mention(
    event: dict[str, Any], body: dict[str, Any], context: BoltContext, client: WebClient, sb: Bot
) -> None:
    said = Said.of(event)
    if said is None:
        return
    thread_ts = said.thread_ts or said.ts
    text = question_text(said.text, context.bot_user_id)
    if not text:
        say(client, said.channel, thread_ts, m.EMPTY_MENTION)
        return
    ask(sb, client, Question.of(text, said, body))


@boundary
def on_message(
    event: dict[str, Any], body: dict[str, Any], context: BoltContext, client: WebClient, sb: Bot
) -> None:
    """DMs, and replies in channel threads the bot answered in; everything else is ignored."""
    said = Said.of(event)
    if said is None:
        return
    if said.channel_type != "im":
        if not said.thread_ts or said.thread_ts == said.ts:
            return  # channel chatter is not for us
        if context.bot_user_id and bot_mention(context.bot_user_id).search(said.text):
            return  # a mention: the app_mention listener has it
        if sb.threads.last_run(said.channel, said.thread_ts) is None:
            return  # a thread the bot never answered in
    text = question_text(said.text, context.bot_user_id)
    if not text:
        return
    ask(sb, client, Question.of(text, said, body, overheard=said.channel_type != "im"))


# -- assistant threads -----------------------------------------------------------------------------


@boundary
def on_assistant_thread_started(
    event: dict[str, Any], client: WebClient, set_suggested_prompts: SetSuggestedPrompts, sb: Bot
) -> None:
    thread = event.get("assistant_thread")
    thread = thread if isinstance(thread, dict) else {}
    channel = ids.shaped(ids.CHANNEL, thread.get("channel_id"))
    thread_ts = ids.shaped(ids.TS, thread.get("thread_ts"))
    if channel is None or thread_ts is None:
        log.warning("event_malformed", type="assistant_thread_started")
        return
    sb.threads.mark_assistant(channel, thread_ts)
    say(client, channel, thread_ts, m.ASSISTANT_GREETING)
    set_suggested_prompts(prompts=m.SUGGESTED_PROMPTS, title=m.SUGGESTED_PROMPTS_TITLE)


def on_assistant_context_changed() -> None:
    """The viewed channel changed; Switchboard does not use it (and stores nothing)."""


@boundary
def on_assistant_message(
    event: dict[str, Any],
    body: dict[str, Any],
    context: BoltContext,
    client: WebClient,
    set_title: SetTitle,
    set_status: SetStatus,
    sb: Bot,
) -> None:
    """A message in a DM thread: an assistant thread, or a reply to an answer in a DM."""
    said = Said.of(event)
    if said is None or said.thread_ts is None:
        return
    channel, thread_ts = said.channel, said.thread_ts
    text = question_text(said.text, context.bot_user_id)
    if not text:
        return
    in_assistant = sb.threads.is_assistant(channel, thread_ts)
    if in_assistant:  # before the run exists, so it cannot land after the answer
        set_status(
            status=m.ASSISTANT_STATUS.format(text="Thinking"), loading_messages=m.ASSISTANT_LOADING
        )
    run = ask(sb, client, Question.of(text, said, body, assistant=in_assistant))
    if in_assistant and run is None:
        set_status(status="")
    elif in_assistant and run is not None and run.parent_id is None:
        set_title(cut(text, 100))


# -- App Home ------------------------------------------------------------------------------------


@boundary
def on_home_opened(event: dict[str, Any], body: dict[str, Any], client: WebClient, sb: Bot) -> None:
    user = ids.shaped(ids.USER, event.get("user"))
    if event.get("tab") == "home" and user:
        publish_home(sb, client, user, user_team(body))


def publish_home(sb: Bot, client: WebClient, user_id: str, team: str, page: int = 0) -> None:
    roles = sb.identity.roles(user_id, team)
    view = build_home(
        sb.rt,
        user_id,
        roles,
        decides=lambda request, user, held: may_decide(sb, request, user, held),
        page=page,
    )
    client.views_publish(user_id=user_id, view=view)


@boundary
def on_home_page(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Previous / Next in the App Home's list of requests waiting for a decision."""
    ack()
    clicked = Clicked.of(body)
    value = action.get("value")
    if clicked is None or not (isinstance(value, str) and value.isdigit() and len(value) < 6):
        return
    publish_home(sb, client, clicked.user, clicked.team, page=int(value))


# -- buttons and modals ---------------------------------------------------------------------------


def tell(client: WebClient, clicked: Clicked, text: str) -> None:
    """An answer only the clicker sees: ephemeral in the channel, or a small modal (on top
    of the modal clicked in, if any)."""
    if clicked.channel:
        client.chat_postEphemeral(
            channel=clicked.channel,
            user=clicked.user,
            text=text,
            thread_ts=clicked.thread_ts or None,
        )
    elif clicked.trigger_id:
        view = modal("Switchboard", [{"type": "section", "text": {"type": "mrkdwn", "text": text}}])
        if clicked.in_modal:
            client.views_push(trigger_id=clicked.trigger_id, view=view)
        else:
            client.views_open(trigger_id=clicked.trigger_id, view=view)


@boundary
def on_approve(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    approval_id = action_value(action, ids.APPROVAL)
    if approval_id is None:
        return
    clicked = Clicked.of(body)
    if clicked is None:
        return
    after_decision(sb, client, clicked, decide(sb, approval_id, clicked, approve=True))


def may_decide(sb: Bot, request: ApprovalRequest, user: str, roles: frozenset[str]) -> bool:
    return sb.identity.may_decide(
        request.tool, request.requester, user, roles, escalated=request.escalated
    )


def decide(
    sb: Bot,
    approval_id: str,
    clicked: Clicked,
    *,
    approve: bool,
    reason: str = "",
    edited_args: dict[str, Any] | None = None,
    instructions: str = "",
) -> service.DecisionOutcome:
    """service.decide, after the check only Slack knows of: an external person (Slack
    Connect) decides only with an approver role they hold by name."""
    roles = clicked.roles(sb.identity)
    request = sb.rt.approvals.find(approval_id)
    if (
        request is not None
        and not request.decided
        and not may_decide(sb, request, clicked.user, roles)
    ):
        sb.rt.events.append(
            request.run_id, "decision_refused", approval_id=approval_id, by=clicked.user
        )
        approvers = sb.rt.policy.approvers_text(request.tool)
        return service.DecisionOutcome(service.DecisionResult.NOT_ALLOWED, request, approvers)
    return service.decide(
        sb.rt,
        approval_id,
        decider_id=clicked.user,
        decider_roles=roles,
        approve=approve,
        reason=reason,
        edited_args=edited_args,
        instructions=instructions,
    )


def clicked_request(
    body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> tuple[Clicked, ApprovalRequest] | None:
    """Who clicked a card's button and the request it is about; malformed clicks are
    dropped, a request that no longer exists is said so to the clicker."""
    approval_id = action_value(action, ids.APPROVAL)
    clicked = Clicked.of(body)
    if approval_id is None or clicked is None:
        return None
    request = sb.rt.approvals.find(approval_id)
    if request is None:
        tell(client, clicked, m.APPROVAL_NOT_FOUND)
        return None
    return clicked, request


@boundary
def on_reject(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Check the clicker first, then ask for a reason in a modal (the trigger lasts 3 s)."""
    ack()
    found = clicked_request(body, action, client, sb)
    if found is None:
        return
    clicked, request = found
    if request.decided:
        tell(client, clicked, m.ALREADY_DECIDED.format(outcome=outcome_text(request)))
        return
    roles = clicked.roles(sb.identity)
    if not may_decide(sb, request, clicked.user, roles):
        approvers = escape(sb.rt.policy.approvers_text(request.tool))
        tell(client, clicked, m.NOT_ALLOWED_TO_DECIDE.format(approvers=approvers))
        return
    client.views_open(
        trigger_id=clicked.trigger_id, view=reject_modal(request, clicked.metadata(request.id))
    )


@boundary
def on_reject_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    meta = read_metadata(view.get("private_metadata"))
    approval_id = ids.shaped(ids.APPROVAL, meta.get("approval_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    if approval_id is None or user is None:
        log.warning("reject_submission_rejected")
        return
    typed = dig(view, "state", "values", REJECT_REASON_BLOCK, REJECT_REASON_INPUT, "value")
    clicked = Clicked.submitted(user, user_team(body)[:64], meta)
    reason = typed[:REASON_MAX] if isinstance(typed, str) else ""
    told = dig(
        view, "state", "values", REJECT_INSTRUCTIONS_BLOCK, REJECT_INSTRUCTIONS_INPUT, "value"
    )
    instructions = told[:INSTRUCTIONS_MAX] if isinstance(told, str) else ""
    outcome = decide(
        sb, approval_id, clicked, approve=False, reason=reason, instructions=instructions
    )
    after_decision(sb, client, clicked, outcome)


def after_decision(
    sb: Bot, client: WebClient, clicked: Clicked, outcome: service.DecisionOutcome
) -> None:
    result, request = outcome.result, outcome.request
    log.info(
        "decision",
        result=result.value,
        user=clicked.user,
        approval_id=request.id if request else None,
    )
    if result == service.DecisionResult.NOT_FOUND or request is None:
        tell(client, clicked, m.APPROVAL_NOT_FOUND)
    elif result == service.DecisionResult.NOT_ALLOWED:
        tell(client, clicked, m.NOT_ALLOWED_TO_DECIDE.format(approvers=escape(outcome.approvers)))
    elif result == service.DecisionResult.INVALID_EDIT:
        why = outcome.refused.message if outcome.refused else ""
        tell(client, clicked, m.EDIT_INVALID.format(why=escape(why)))
    elif result == service.DecisionResult.ALREADY_DECIDED:
        tell(client, clicked, m.ALREADY_DECIDED.format(outcome=outcome_text(request)))
        sb.surface.show_outcome(request, also=clicked.card)
    else:
        sb.surface.show_outcome(request, also=clicked.card)
    if clicked.in_home:
        publish_home(sb, client, clicked.user, clicked.team, page=clicked.home_page)


@boundary
def on_cancel(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    run_id = action_value(action, ids.RUN)
    if run_id is None:
        return
    clicked = Clicked.of(body)
    if clicked is None:
        return
    tell(client, clicked, cancel_run(sb, run_id, clicked.user, clicked.team))


def cancel_run(sb: Bot, run_id: str, user: str, team: str) -> str:
    result = service.cancel(sb.rt, run_id, by=user, roles=sb.identity.roles(user, team))
    words = {
        service.CancelResult.CANCELLING: m.CANCELLING,
        service.CancelResult.NOT_ALLOWED: m.CANCEL_NOT_ALLOWED,
        service.CancelResult.ALREADY_ENDED: m.CANCEL_ALREADY_ENDED,
        service.CancelResult.NOT_FOUND: m.RUN_NOT_FOUND,
    }
    return words[result].format(run_id=run_id)


@boundary
def on_show_args(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """The full arguments, read from Redis: for the requester, deciders and admins."""
    ack()
    found = clicked_request(body, action, client, sb)
    if found is None:
        return
    clicked, request = found
    roles = clicked.roles(sb.identity)
    if not (
        clicked.user == request.requester
        or may_decide(sb, request, clicked.user, roles)
        or sb.rt.policy.is_admin(roles)
    ):
        tell(client, clicked, m.ARGS_NOT_YOURS)
        return
    client.views_open(trigger_id=clicked.trigger_id, view=args_modal(request))


@boundary
def on_view_run(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    run_id = action_value(action, ids.RUN)
    if run_id is None:
        return
    clicked = Clicked.of(body)
    if clicked is None:
        return
    problem = show_run(sb, client, run_id, clicked.user, clicked.team, clicked.trigger_id)
    if problem:
        tell(client, clicked, problem)


def show_run(sb: Bot, client: WebClient, run_id: str, user: str, team: str, trigger_id: str) -> str:
    """Open the trajectory modal; returns what to say instead when the user may not see it."""
    run = sb.rt.store.find(run_id)
    if run is None:
        return m.RUN_NOT_FOUND.format(run_id=run_id)
    roles = sb.identity.roles(user, team)
    if not service.may_inspect(sb.rt, run, user, roles):
        return m.RUN_NOT_YOURS.format(run_id=run_id)
    if not trigger_id:
        log.warning("run_modal_without_trigger", run_id=run_id)
        return ""
    offer_save, note = demos.offer(sb.rt, run) if sb.rt.policy.is_admin(roles) else (False, "")
    client.views_open(
        trigger_id=trigger_id, view=inspected(sb, run, offer_save=offer_save, note=note)
    )
    return ""


def inspected(sb: Bot, run: Run, *, offer_save: bool = False, note: str = "") -> dict[str, Any]:
    cancelled_by = sb.rt.store.cancel_requested_by(run.id)
    events = sb.rt.events.read(run.id)
    return run_modal(run, events, cancelled_by, offer_save=offer_save, note=note)


@boundary
def on_save_demo(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Admins only, checked again here: the button is only shown to them, but anyone can
    send a click."""
    ack()
    run_id = action_value(action, ids.RUN)
    clicked = Clicked.of(body)
    if run_id is None or clicked is None:
        return
    if not sb.rt.policy.is_admin(clicked.roles(sb.identity)):
        log.warning("demo_save_refused", user=clicked.user, run_id=run_id)
        tell(client, clicked, m.DEMO_ADMINS_ONLY)
        return
    run = sb.rt.store.find(run_id)
    if run is None:
        tell(client, clicked, m.RUN_NOT_FOUND.format(run_id=run_id))
        return
    text = demos.save(sb.rt, run, clicked.user)
    if not clicked.view_id:
        tell(client, clicked, text)
        return
    try:  # the modal it was clicked in: the button gives way to what happened
        client.views_update(view_id=clicked.view_id, view=inspected(sb, run, note=text))
    except SlackApiError as exc:  # e.g. the modal was closed meanwhile
        log.info("run_modal_gone", error=exc.response.get("error"))
        tell(client, clicked, text)


# -- the slash command ---------------------------------------------------------------------------


@boundary
def on_command(ack: Ack, command: dict[str, Any], client: WebClient, sb: Bot) -> None:
    ack()
    asked = Asked.of(command)
    if asked is None:
        return
    user = asked.user
    parsed = parse(asked.text)
    if parsed.verb == "help":
        answer(client, asked, text=m.HELP)
    elif parsed.verb == "error":
        answer(client, asked, text=parsed.error)
    elif parsed.verb == "runs":
        admin = sb.rt.policy.is_admin(sb.identity.roles(user, asked.team))
        blocks = runs_listing(sb.rt, parsed, user, admin)
        answer(client, asked, text=m.RUNS_FALLBACK, blocks=blocks)
    elif parsed.verb == "run" and parsed.run_id:
        problem = show_run(sb, client, parsed.run_id, user, asked.team, asked.trigger_id)
        if problem:
            answer(client, asked, text=problem)
    elif parsed.verb == "cancel" and parsed.run_id:
        answer(client, asked, text=cancel_run(sb, parsed.run_id, user, asked.team))
    log.info("command", verb=parsed.verb, user=user, channel=asked.channel)


def answer(
    client: WebClient,
    asked: Asked,
    *,
    text: str,
    blocks: list[dict[str, Any]] | None = None,
) -> None:
    """Ephemeral, in the channel the command was typed in; through the command's
    response_url when the bot cannot post there (e.g. it is not a member)."""
    try:
        client.chat_postEphemeral(channel=asked.channel, user=asked.user, text=text, blocks=blocks)
    except SlackApiError as exc:
        url = asked.response_url
        if not url.startswith("https://hooks.slack.com/"):
            raise
        log.info("command_answer_via_response_url", error=exc.response.get("error"))
        WebhookClient(url).send(text=text, blocks=blocks, response_type="ephemeral")


# -- the installation going away -------------------------------------------------------------------


@boundary
def on_installation_gone(event: dict[str, Any], body: dict[str, Any], sb: Bot) -> None:
    """`app_uninstalled`, or `tokens_revoked` naming a bot token (ours: Slack sends it to
    the app whose tokens they were): stop posting to that workspace, cancel its runs in
    flight and withdraw their pending approvals, so nothing waits on people who can no
    longer see it. User tokens alone do not matter: Switchboard holds none."""
    why = str(event.get("type"))
    tokens = event.get("tokens")
    if why == "tokens_revoked" and not (isinstance(tokens, dict) and tokens.get("bot")):
        log.info("slack_user_tokens_revoked", team=team_of(body))
        return
    team = team_of(body)
    sb.installations.revoke(team, why)
    runs = [
        run
        for status in IN_FLIGHT
        for run in sb.rt.store.recent(status=status, limit=SCAN)
        if run.origin.get("surface") == "slack" and run.origin.get("team", "") in ("", team)
    ]
    for run in runs:
        service.request_cancel(sb.rt, run, by=why)
    ours = {run.id for run in runs}
    withdrawn = 0
    for request in sb.rt.approvals.pending(limit=SCAN):
        if request.run_id in ours:
            decision = sb.rt.approvals.withdraw(request.id, m.WITHDRAWN_UNINSTALLED)
            if decision.won:
                sb.rt.cancel_expiry(request.id)
                withdrawn += 1
    log.warning("slack_installation_gone", why=why, team=team, runs=len(runs), approvals=withdrawn)


# -- everything no listener above claims ------------------------------------------------------


def on_other_event(event: dict[str, Any]) -> None:
    """Events we do not act on (Bolt has acked them): `member_joined_channel`,
    `channel_shared`, `team_access_granted`, ..."""
    log.info("event_ignored", type=str(event.get("type"))[:60])


def on_other_interaction(ack: Ack, body: dict[str, Any]) -> None:
    """A button of an older build, another app's shortcut, a modal that is not ours."""
    ack()
    log.info("interaction_ignored", type=str(body.get("type"))[:40], id=interaction_id(body))


def on_other_options(ack: Ack, body: dict[str, Any]) -> None:
    ack(options=[])
    log.info("interaction_ignored", type=str(body.get("type"))[:40], id=interaction_id(body))


def on_other_command(ack: Ack, command: dict[str, Any]) -> None:
    name = str(command.get("command"))[:40]
    ack(text=m.COMMAND_NOT_OURS.format(command=escape(name), ours=COMMAND))
    log.info("command_ignored", command=name)
