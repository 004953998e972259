"""Questions: a mention of the bot, a DM, a reply in a channel thread the bot answered in.
Each becomes a run (`ask`), continuing the thread's conversation if the bot answered there.
Assistant threads (`bot.listeners.assistant`) ask through `ask` too."""

from __future__ import annotations

import threading
from typing import Any

import redis
import structlog
from slack_bolt import BoltContext
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from bot.listeners.base import Bot, boundary, say
from bot.render import messages as m
from bot.render.mrkdwn import escape
from bot.transport.payloads import Question, Said, bot_mention, question_text
from worker import service
from worker.run import Run
from worker.service import runs

log = structlog.get_logger(__name__)


def ask(sb: Bot, client: WebClient, q: Question) -> Run | None:
    """Create the run (continuing the thread's conversation, if the bot answered there).
    When Redis fails before the run exists, the person is told nothing was started: Slack
    has its ack and `attach` claimed the event, so no retry would bring the question back,
    and unless told the person waits for an answer that never comes."""
    try:
        return _ask(sb, client, q)
    except (redis.RedisError, service.QuestionNotStarted) as exc:
        error = str(exc) if isinstance(exc, service.QuestionNotStarted) else type(exc).__name__
        log.warning("question_submit_failed", event_id=q.event_id, error=error)
        not_started(sb, client, q)
        return None


def _ask(sb: Bot, client: WebClient, q: Question) -> Run | None:
    requester = sb.identity.requester(q.user, q.user_team, q.channel)
    if not sb.access.may_ask(requester.roles):
        log.info("question_refused_external", user=q.user, team=q.user_team)
        if not q.overheard:
            say(client, q.channel, q.thread_ts, m.EXTERNAL_CANNOT_ASK)
        return None
    parent = None
    parent_id = sb.threads.last_run(q.channel, q.thread_ts)
    if parent_id:
        parent = runs.find(sb.rt, parent_id)
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
    try:  # the run goes on either way; a reply in the thread would start a new conversation
        sb.threads.remember(q.channel, q.thread_ts, run.id)
    except redis.RedisError as exc:
        log.warning("thread_not_remembered", run_id=run.id, error=type(exc).__name__)
    log.info("run_submitted", run_id=run.id, user=q.user, channel=q.channel, parent=parent_id)
    return run


def not_started(sb: Bot, client: WebClient, q: Question) -> None:
    """Tell the person nothing was started, and give the event back, so that a Slack retry
    of it can still start the run (`attach` claimed it, and drops what it claimed before)."""
    try:
        sb.threads.release_event(q.event_id)
    except redis.RedisError as exc:  # Redis still down: the person is told all the same
        log.warning("event_claim_kept", event_id=q.event_id, error=type(exc).__name__)
    if q.overheard:
        # A reply the bot overheard was not addressed to it: only its author is told, not
        # everyone in the thread. A mention, a DM or an assistant thread is answered in the
        # thread, where the answer would have been, as `ask`'s other refusals are.
        client.chat_postEphemeral(
            channel=q.channel, user=q.user, text=m.QUESTION_NOT_STARTED, thread_ts=q.thread_ts
        )
    else:
        say(client, q.channel, q.thread_ts, m.QUESTION_NOT_STARTED)


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
    answered: bool | None = True  # a DM is for the bot
    if said.channel_type != "im":
        if not said.thread_ts or said.thread_ts == said.ts:
            return  # channel chatter is not for us
        if context.bot_user_id and bot_mention(context.bot_user_id).search(said.text):
            return  # a mention: the app_mention listener has it
        answered = answered_in(sb, client, said.channel, said.thread_ts, context.bot_user_id)
        if answered is False:
            return  # a thread the bot never answered in
    text = question_text(said.text, context.bot_user_id)
    if not text:
        return
    question = Question.of(text, said, body, overheard=said.channel_type != "im")
    if answered is None:  # Redis cannot say; Slack says the bot replied in this thread
        not_started(sb, client, question)
        return
    ask(sb, client, question)


# Slack's copy of a thread, read when Redis cannot say whether the bot answered in it: one
# page (Slack caps this method at 15 messages for some apps), one read at a time per process
# (others meanwhile count as unanswered), and no retry after a 429: the listener's own
# client would sleep out Slack's Retry-After in a listener thread.
THREAD_PAGE = 15
_looking = threading.Semaphore(1)


def answered_in(
    sb: Bot, client: WebClient, channel: str, thread_ts: str, bot_user_id: str | None
) -> bool | None:
    """Did the bot answer in this channel thread? Redis remembers (True or False). When
    Redis cannot be asked, Slack's copy of the thread tells whether the bot replied there:
    None when it did (the question cannot be taken now: its author is told so instead of
    being dropped unheard), False when not, or when Slack cannot say either."""
    try:
        return sb.threads.last_run(channel, thread_ts) is not None
    except redis.RedisError as exc:
        log.warning("thread_lookup_failed", channel=channel, error=type(exc).__name__)
    if not bot_user_id or not _looking.acquire(blocking=False):
        return False
    try:
        once = WebClient(  # the listener's client, less its retry handlers
            token=client.token,
            base_url=client.base_url,
            timeout=client.timeout,
            ssl=client.ssl,
            proxy=client.proxy,
        )
        replies = once.conversations_replies(channel=channel, ts=thread_ts, limit=THREAD_PAGE)
    except (SlackClientError, OSError) as exc:  # Slack refused, or could not be reached
        log.warning("thread_lookup_failed", channel=channel, error=type(exc).__name__, slack=True)
        return False
    finally:
        _looking.release()
    replied = any(  # a reply of the bot's, not a card it started the thread with
        isinstance(msg, dict) and msg.get("user") == bot_user_id and msg.get("ts") != thread_ts
        for msg in replies.get("messages") or []
    )
    return None if replied else False
