"""Assistant threads (Slack's AI app surface): a greeting with suggested prompts when one
starts, a status while the run is being created, and the thread's title from its first
question. The question itself is asked as any other (`questions.ask`)."""

from __future__ import annotations

from typing import Any

import redis
import structlog
from slack_bolt import BoltContext
from slack_bolt.context.set_status import SetStatus
from slack_bolt.context.set_suggested_prompts import SetSuggestedPrompts
from slack_bolt.context.set_title import SetTitle
from slack_sdk import WebClient

from bot.listeners.base import Bot, boundary, say
from bot.listeners.questions import ask
from bot.render import messages as m
from bot.render.mrkdwn import cut
from bot.transport import ids
from bot.transport.payloads import Question, Said, question_text

log = structlog.get_logger(__name__)


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
    try:
        in_assistant = sb.threads.is_assistant(channel, thread_ts)
    except redis.RedisError as exc:  # a DM to the bot either way: `ask` tells them if it fails
        log.warning("assistant_lookup_failed", channel=channel, error=type(exc).__name__)
        in_assistant = False
    if in_assistant:  # before the run exists, so it cannot land after the answer
        set_status(
            status=m.ASSISTANT_STATUS.format(text="Thinking"), loading_messages=m.ASSISTANT_LOADING
        )
    run = ask(sb, client, Question.of(text, said, body, assistant=in_assistant))
    if in_assistant and run is None:
        set_status(status="")
    elif in_assistant and run is not None and run.parent_id is None:
        set_title(cut(text, 100))
