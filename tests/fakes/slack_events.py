"""Talking to a Bolt app as Slack does: signed HTTP requests and the payloads Slack sends
(events, button clicks, slash commands, modal submissions).

    event = app_mention("<@UBOT> hello", user="U0USER", channel="C1")
    answer = send_signed(app_url, SIGNING_SECRET, event_callback(event))
    assert answer.status == 200
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

__all__ = [
    "SignedResponse",
    "app_mention",
    "block_actions",
    "event_callback",
    "form_payload",
    "message",
    "message_im",
    "next_ts",
    "send_signed",
    "signed_headers",
    "slash_command",
    "view_submission",
]

TEAM_ID = "T0001"
BOT_USER_ID = "UBOT"
BOT_ID = "B0001"
APP_ID = "A0001"
DEFAULT_USER = "U0USER"

# ---------------------------------------------------------------------------------------
# Timestamps: one increasing sequence shared by FakeSlack and the event builders, so a
# user's message built after the bot's reply sorts after it in a thread.
# ---------------------------------------------------------------------------------------

_ts_lock = threading.Lock()
_ts_counter = itertools.count(1)
_TS_BASE_MICROS = 1_700_000_000_000_000


def next_ts() -> str:
    """A unique, increasing message ts per process: "1700000000.000100", ".000200", ..."""
    with _ts_lock:
        micros = _TS_BASE_MICROS + 100 * next(_ts_counter)
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


# ---------------------------------------------------------------------------------------
# Sending signed requests to a Bolt app
# ---------------------------------------------------------------------------------------


def signed_headers(
    signing_secret: str,
    body: str,
    timestamp: int | None = None,
    *,
    content_type: str | None = None,
) -> dict[str, str]:
    """Headers Slack would send with `body`: v0 HMAC-SHA256 signature and timestamp."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(signing_secret).generate_signature(timestamp=ts, body=body)
    if content_type is None:
        is_json = body.lstrip().startswith("{")
        content_type = "application/json" if is_json else "application/x-www-form-urlencoded"
    return {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": str(signature),
    }


@dataclass(frozen=True)
class SignedResponse:
    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def send_signed(
    url: str,
    signing_secret: str,
    body: str | Mapping[str, Any],
    *,
    timestamp: int | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> SignedResponse:
    """POST a signed request (a dict body is sent as JSON) and return the answer, whatever
    its status. `headers` are added after signing (e.g. X-Slack-Retry-Num)."""
    text = json.dumps(body) if isinstance(body, Mapping) else body
    all_headers = {**signed_headers(signing_secret, text, timestamp), **(headers or {})}
    request = urllib.request.Request(url, data=text.encode("utf-8"), headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return SignedResponse(
                response.status, dict(response.headers.items()), response.read().decode("utf-8")
            )
    except urllib.error.HTTPError as error:
        return SignedResponse(error.code, dict(error.headers.items()), error.read().decode("utf-8"))


# ---------------------------------------------------------------------------------------
# Payload builders
# ---------------------------------------------------------------------------------------

_ids = itertools.count(1)


def _trigger_id() -> str:
    return f"{next(_ids)}.{int(time.time())}.fake{next(_ids):08x}"


def form_payload(payload: Mapping[str, Any]) -> str:
    """An interactivity body: `payload=<url-encoded JSON>`."""
    return urlencode({"payload": json.dumps(payload)})


def event_callback(
    event: Mapping[str, Any],
    event_id: str | None = None,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    *,
    bot_user_id: str = BOT_USER_ID,
) -> dict[str, Any]:
    """The Events API envelope around `event` (send it as JSON)."""
    return {
        "token": "fake-verification-token",
        "team_id": team_id,
        "api_app_id": api_app_id,
        "event": dict(event),
        "type": "event_callback",
        "event_id": event_id or f"Ev{next(_ids):08d}",
        "event_time": int(time.time()),
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": f"4-fake-{next(_ids)}",
    }


def _message_event(
    kind: str,
    text: str,
    user: str,
    channel: str,
    ts: str | None,
    thread_ts: str | None,
    team_id: str,
    channel_type: str | None,
) -> dict[str, Any]:
    ts = ts or next_ts()
    event: dict[str, Any] = {
        "type": kind,
        "user": user,
        "text": text,
        "ts": ts,
        "channel": channel,
        "event_ts": ts,
        "team": team_id,
        "client_msg_id": f"fake-msg-{next(_ids)}",
    }
    if channel_type is not None:
        event["channel_type"] = channel_type
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return event


def app_mention(
    text: str,
    user: str = DEFAULT_USER,
    channel: str = "C0001",
    ts: str | None = None,
    thread_ts: str | None = None,
    *,
    team_id: str = TEAM_ID,
) -> dict[str, Any]:
    """An app_mention event; `text` as the user typed it, e.g. "<@UBOT> hello"."""
    return _message_event("app_mention", text, user, channel, ts, thread_ts, team_id, None)


def message(
    text: str,
    user: str = DEFAULT_USER,
    channel: str = "C0001",
    ts: str | None = None,
    thread_ts: str | None = None,
    *,
    channel_type: str = "channel",
    team_id: str = TEAM_ID,
) -> dict[str, Any]:
    """A `message` event (a channel message or thread reply; see message_im for DMs)."""
    return _message_event("message", text, user, channel, ts, thread_ts, team_id, channel_type)


def message_im(
    text: str,
    user: str = DEFAULT_USER,
    channel: str = "D0001",
    ts: str | None = None,
    thread_ts: str | None = None,
    *,
    team_id: str = TEAM_ID,
) -> dict[str, Any]:
    """A direct message to the bot (`message` event, channel_type "im")."""
    return _message_event("message", text, user, channel, ts, thread_ts, team_id, "im")


def assistant_thread_started(
    thread_ts: str, user: str = DEFAULT_USER, channel: str = "D0001"
) -> dict[str, Any]:
    """An `assistant_thread_started` event: `user` opened an assistant thread in their DM."""
    return {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": user,
            "channel_id": channel,
            "thread_ts": thread_ts,
            "context": {},
        },
        "event_ts": thread_ts,
    }


def block_actions(
    action_id: str,
    value: str,
    user_id: str = DEFAULT_USER,
    channel: str = "C0001",
    message_ts: str | None = None,
    trigger_id: str | None = None,
    *,
    block_id: str = "actions",
    team_id: str = TEAM_ID,
    thread_ts: str | None = None,
    message: Mapping[str, Any] | None = None,
    view: Mapping[str, Any] | None = None,
) -> str:
    """A button click, as the form body Slack posts. With `view`, the click came from a
    modal or App Home instead of a message."""
    action = {
        "type": "button",
        "action_id": action_id,
        "block_id": block_id,
        "value": value,
        "text": {"type": "plain_text", "text": action_id, "emoji": True},
        "action_ts": f"{time.time():.6f}",
    }
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {
            "id": user_id,
            "username": user_id.lower(),
            "name": user_id.lower(),
            "team_id": team_id,
        },
        "api_app_id": APP_ID,
        "token": "fake-verification-token",
        "trigger_id": trigger_id or _trigger_id(),
        "team": {"id": team_id, "domain": "fake-workspace"},
        "enterprise": None,
        "is_enterprise_install": False,
        "state": {"values": {}},
        "actions": [action],
    }
    if view is not None:
        payload["container"] = {"type": "view", "view_id": view.get("id", "")}
        payload["view"] = dict(view)
        return form_payload(payload)
    ts = message_ts or next_ts()
    container: dict[str, Any] = {
        "type": "message",
        "message_ts": ts,
        "channel_id": channel,
        "is_ephemeral": False,
    }
    shown = (
        dict(message)
        if message is not None
        else {
            "type": "message",
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
            "ts": ts,
            "text": "",
        }
    )
    if thread_ts is not None:
        container["thread_ts"] = thread_ts
        shown.setdefault("thread_ts", thread_ts)
    payload.update(
        {
            "container": container,
            "channel": {"id": channel, "name": channel.lower()},
            "message": shown,
            "response_url": f"https://hooks.slack.invalid/actions/{team_id}/{next(_ids)}/fake",
        }
    )
    return form_payload(payload)


def slash_command(
    command: str,
    text: str = "",
    user_id: str = DEFAULT_USER,
    channel_id: str = "C0001",
    trigger_id: str | None = None,
    *,
    team_id: str = TEAM_ID,
) -> str:
    """A slash command invocation, as the form body Slack posts."""
    return urlencode(
        {
            "token": "fake-verification-token",
            "team_id": team_id,
            "team_domain": "fake-workspace",
            "channel_id": channel_id,
            "channel_name": channel_id.lower(),
            "user_id": user_id,
            "user_name": user_id.lower(),
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": f"https://hooks.slack.invalid/commands/{team_id}/{next(_ids)}/fake",
            "trigger_id": trigger_id or _trigger_id(),
        }
    )


def view_submission(
    callback_id: str,
    values: Mapping[str, Any] | None = None,
    user_id: str = DEFAULT_USER,
    *,
    private_metadata: str = "",
    view_id: str = "V0001",
    team_id: str = TEAM_ID,
    trigger_id: str | None = None,
    view_hash: str = "1700000000.fakehash",
    blocks: Sequence[Mapping[str, Any]] = (),
    title: str = "Switchboard",
) -> str:
    """A modal submission, as the form body Slack posts. `values` is view.state.values:
    {block_id: {action_id: {"type": "plain_text_input", "value": "..."}}}."""
    view = {
        "id": view_id,
        "team_id": team_id,
        "type": "modal",
        "blocks": list(blocks),
        "private_metadata": private_metadata,
        "callback_id": callback_id,
        "state": {"values": dict(values or {})},
        "hash": view_hash,
        "title": {"type": "plain_text", "text": title},
        "clear_on_close": False,
        "notify_on_close": False,
        "close": None,
        "submit": {"type": "plain_text", "text": "Submit"},
        "previous_view_id": None,
        "root_view_id": view_id,
        "app_id": APP_ID,
        "external_id": "",
        "app_installed_team_id": team_id,
        "bot_id": BOT_ID,
    }
    payload = {
        "type": "view_submission",
        "team": {"id": team_id, "domain": "fake-workspace"},
        "user": {
            "id": user_id,
            "username": user_id.lower(),
            "name": user_id.lower(),
            "team_id": team_id,
        },
        "api_app_id": APP_ID,
        "token": "fake-verification-token",
        "trigger_id": trigger_id or _trigger_id(),
        "view": view,
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }
    return form_payload(payload)
