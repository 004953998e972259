"""Reading Slack's payloads: who asked or clicked, where, and about what, every id checked
for its shape (`bot.transport.ids`). Nothing here calls Slack or Redis, or is a Bolt
listener: the listeners (`bot.listeners`) read their payloads through it.

A payload that lacks an id a listener needs reads as None (logged as malformed), so it is
dropped, never half-handled. Everything in a payload is the sender's to forge: values are
bounded before they are parsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bot.transport import ids

log = structlog.get_logger(__name__)

METADATA_MAX = 3000
SLACKBOT = "USLACKBOT"  # Slackbot's messages carry no bot_id, but it is not a person
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))


def dig(data: Any, *keys: str) -> Any:
    """data[k1][k2]..., or None where a level is missing or not an object."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


# -- teams -----------------------------------------------------------------------------------


def envelope_team(body: Mapping[str, Any]) -> tuple[str, str]:
    """(team, enterprise) the request was sent for: events and commands say `team_id`,
    clicks and modals `team` (null for an org-wide install) and `enterprise`."""
    team = body.get("team_id") or body.get("team")
    if isinstance(team, dict):
        team = team.get("id")
    enterprise = body.get("enterprise_id") or body.get("enterprise")
    if isinstance(enterprise, dict):
        enterprise = enterprise.get("id")
    return (team if isinstance(team, str) else ""), (
        enterprise if isinstance(enterprise, str) else ""
    )


KIND = re.compile(r"[a-z_]{1,40}")


def request_kind(body: Any) -> str:
    """What a request from Slack is, for its trace span: the payload type (`block_actions`,
    `view_submission`, ...), and an event's own type after it (`event_callback app_mention`).
    Anything not shaped like one is `unknown`: a span name must stay one of a few."""
    if not isinstance(body, Mapping):
        return "unknown"
    found = body.get("type")
    kind = found if isinstance(found, str) else ""
    if not kind and isinstance(body.get("command"), str):
        kind = "slash_command"
    if not KIND.fullmatch(kind):
        return "unknown"
    event = body.get("event")
    if kind == "event_callback" and isinstance(event, Mapping):
        inner = event.get("type")
        if isinstance(inner, str) and KIND.fullmatch(inner):
            return f"{kind} {inner}"
    return kind


def user_team(body: Mapping[str, Any]) -> str:
    """The asking person's own team: for a Slack Connect user, their organisation's, not
    the workspace the request was sent for. Falls back to the envelope's team."""
    event = body.get("event")
    found: Any = None
    if isinstance(event, dict):
        found = event.get("user_team") or dig(event, "user_profile", "team") or event.get("team")
    if not found:
        found = dig(body, "user", "team_id")
    if not isinstance(found, str) or not found:
        found = envelope_team(body)[0]
    return found


def team_of(body: dict[str, Any]) -> str:
    """The workspace (or, for an org-wide install, the org) the request was sent for; one
    `Home` serves, or `attach` would have refused the request."""
    team, enterprise = envelope_team(body)
    return (team or enterprise)[:64]


# -- messages: mentions, DMs, thread replies ---------------------------------------------------


@dataclass(frozen=True)
class Said:
    """A person's message, from an `app_mention` or `message` event, every id checked."""

    user: str
    channel: str
    ts: str
    thread_ts: str | None
    text: str
    channel_type: str

    @classmethod
    def of(cls, event: dict[str, Any]) -> Said | None:
        """None for bots (Slackbot too), edits and other subtypes, and for events that are
        malformed. A thread reply also sent to the channel (`thread_broadcast`) is a reply.
        An edit of a message that mentions the bot comes as a fresh `app_mention` (a new
        event id, the same ts, an `edited` field): it is the question already asked, so it
        starts no second run and does not count against the asker's limits again."""
        if event.get("subtype") not in (None, "file_share", "thread_broadcast"):
            return None
        if event.get("edited") is not None:
            log.info("event_edit_ignored", type=str(event.get("type"))[:40])
            return None
        if event.get("bot_id") or event.get("user") == SLACKBOT:
            return None
        user = ids.shaped(ids.USER, event.get("user"))
        channel = ids.shaped(ids.CHANNEL, event.get("channel"))
        ts = ids.shaped(ids.TS, event.get("ts"))
        thread_ts = event.get("thread_ts")
        text = event.get("text") or ""
        channel_type = event.get("channel_type") or ""
        if (
            user is None
            or channel is None
            or ts is None
            or (thread_ts is not None and ids.shaped(ids.TS, thread_ts) is None)
            or not isinstance(text, str)
            or not isinstance(channel_type, str)
        ):
            log.warning("event_malformed", type=str(event.get("type"))[:40])
            return None
        return cls(user, channel, ts, thread_ts, text, channel_type)


@dataclass(frozen=True)
class Question:
    text: str
    user: str
    team: str  # the workspace the event was sent for (the installation)
    user_team: str  # the asker's own team: another one for a Slack Connect user
    channel: str
    thread_ts: str
    event_id: str
    assistant: bool = False
    overheard: bool = False  # a thread reply without a mention: refusals are not said

    @classmethod
    def of(
        cls,
        text: str,
        said: Said,
        body: dict[str, Any],
        *,
        assistant: bool = False,
        overheard: bool = False,
    ) -> Question:
        return cls(
            text,
            said.user,
            team_of(body),
            user_team(body)[:64],
            said.channel,
            said.thread_ts or said.ts,
            str(body.get("event_id")),
            assistant=assistant,
            overheard=overheard,
        )


def question_text(text: str, bot_user_id: str | None) -> str:
    """The text without mentions of the bot, with Slack's escaping undone."""
    if bot_user_id:
        text = bot_mention(bot_user_id).sub(" ", text)
    for entity, char in _ENTITIES:
        text = text.replace(entity, char)
    # JSON may carry lone surrogates ("\ud800"); they cannot be encoded for the model's API
    return text.encode("utf-8", "replace").decode("utf-8").strip()


def bot_mention(bot_user_id: str) -> re.Pattern[str]:
    """`<@UBOT>` or `<@UBOT|name>`; not `<@UBOT2>`."""
    return re.compile(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>")


# -- buttons and modals ----------------------------------------------------------------------


@dataclass(frozen=True)
class Clicked:
    """Who clicked where, from the signed payload, and where to answer them."""

    user: str
    team: str = ""  # the clicker's own team (another one for a Slack Connect user)
    channel: str = ""
    message_ts: str = ""
    thread_ts: str = ""
    trigger_id: str = ""
    in_home: bool = False
    view_id: str = ""  # the modal clicked in, if any
    in_modal: bool = False
    home_page: int = 0  # in the App Home: the page of its waiting list shown

    @classmethod
    def of(cls, body: dict[str, Any]) -> Clicked | None:
        """None when the payload does not say who clicked."""
        user = ids.shaped(ids.USER, dig(body, "user", "id"))
        if user is None:
            log.warning("click_without_user")
            return None
        container = body.get("container")
        container = container if isinstance(container, dict) else {}
        in_modal = dig(body, "view", "type") == "modal"
        return cls(
            user=user,
            team=user_team(body)[:64],
            channel=ids.shaped(ids.CHANNEL, container.get("channel_id")) or "",
            message_ts=ids.shaped(ids.TS, container.get("message_ts")) or "",
            thread_ts=ids.shaped(ids.TS, container.get("thread_ts")) or "",
            trigger_id=ids.shaped(ids.TRIGGER, body.get("trigger_id")) or "",
            in_home=container.get("type") == "view" and not in_modal,
            view_id=(ids.shaped(ids.VIEW, dig(body, "view", "id")) or "") if in_modal else "",
            in_modal=in_modal,
            home_page=read_page(dig(body, "view", "private_metadata")),
        )

    @classmethod
    def submitted(
        cls, user: str, team: str, meta: dict[str, str], cards: Sequence[Mapping[str, str]]
    ) -> Clicked:
        """The person who submitted a modal opened from a card, answered where the card is.

        The modal's private metadata (`metadata`) is the sender's to forge, so its channel
        and ts count only when they name one of `cards`, where the request's card was
        posted (the approvals store): a submission about one request can never point the
        bot at another request's card (issue 21, item 8). Otherwise the answer has no
        place, and the request's own cards are updated as always."""
        channel = ids.shaped(ids.CHANNEL, meta.get("channel")) or ""
        ts = ids.shaped(ids.TS, meta.get("ts")) or ""
        if not any(c.get("channel") == channel and c.get("ts") == ts for c in cards):
            channel, ts = "", ""
        return cls(
            user=user,
            team=team,
            channel=channel,
            message_ts=ts,
            thread_ts=(ids.shaped(ids.TS, meta.get("thread_ts")) or "") if ts else "",
            in_home=meta.get("home") == "1",
            home_page=page_number(meta.get("page")),
        )

    @property
    def card(self) -> dict[str, str] | None:
        return {"channel": self.channel, "ts": self.message_ts} if self.message_ts else None

    def metadata(self, approval_id: str) -> str:
        return json.dumps(
            {
                "approval_id": approval_id,
                "channel": self.channel,
                "ts": self.message_ts,
                "thread_ts": self.thread_ts,
                "home": "1" if self.in_home else "",
                "page": str(self.home_page) if self.in_home else "",
            }
        )


def action_value(action: dict[str, Any], pattern: re.Pattern[str]) -> str | None:
    value = action.get("value")
    if ids.shaped(pattern, value):
        return str(value)
    shown = value[:80] if isinstance(value, str) else type(value).__name__
    log.warning("action_value_rejected", action_id=str(action.get("action_id"))[:80], value=shown)
    return None


def page_number(value: Any) -> int:
    """A page number as a button value or metadata field carries it ("3"); 0 if it is not one."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 6:
        return int(value)
    return 0


def read_page(raw: Any) -> int:
    """The page an App Home view says it shows (its private_metadata); 0 if it says none."""
    if not isinstance(raw, str) or len(raw) > 100:
        return 0
    try:
        page = json.loads(raw).get("page")
    except (ValueError, AttributeError):
        return 0
    return page if isinstance(page, int) and not isinstance(page, bool) and 0 <= page < 10**5 else 0


def read_metadata(raw: Any) -> dict[str, str]:
    if not isinstance(raw, str) or not raw or len(raw) > METADATA_MAX:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}


def interaction_id(body: dict[str, Any]) -> str:
    """The action_id, callback_id or view callback_id, for the log."""
    actions = body.get("actions")
    found = (
        (actions[0].get("action_id") if isinstance(actions, list) and actions else None)
        or body.get("action_id")
        or body.get("callback_id")
        or dig(body, "view", "callback_id")
    )
    return str(found)[:80]


# -- the slash command -------------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """A slash command: who typed it where, every id checked."""

    user: str
    team: str
    channel: str
    text: str
    trigger_id: str
    response_url: str

    @classmethod
    def of(cls, command: dict[str, Any]) -> Asked | None:
        user = ids.shaped(ids.USER, command.get("user_id"))
        channel = ids.shaped(ids.CHANNEL, command.get("channel_id"))
        text = command.get("text") or ""
        if user is None or channel is None or not isinstance(text, str):
            log.warning("command_malformed")
            return None
        url = command.get("response_url")
        return cls(
            user=user,
            team=user_team(command)[:64],
            channel=channel,
            text=text,
            trigger_id=ids.shaped(ids.TRIGGER, command.get("trigger_id")) or "",
            response_url=url if isinstance(url, str) else "",
        )
