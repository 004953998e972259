"""FakeSlack: the Slack Web API as a local HTTP server. The helpers that send signed
requests to a Bolt app (tests/fakes/slack_events.py) are re-exported here.

    with FakeSlack() as slack:
        client = WebClient(token="xoxb-test", base_url=slack.url)
        client.chat_postMessage(channel="C1", text="hi")
        assert slack.last("chat.postMessage")["text"] == "hi"

It answers like Slack does (HTTP 200 with `ok: false` for API errors, 429 with
Retry-After when rate limited) and enforces the Block Kit limits our rendering can hit.
`apps.connections.open` (an app-level `xapp-` token) hands out Socket Mode URLs of a local
gateway (tests/fakes/socket_gateway.py).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from tests.fakes._base import FakeServer, QuietHandler, parse_form
from tests.fakes.block_kit import (
    MAX_BLOCKS_TEXT,
    MAX_MESSAGE_BLOCKS,
    MAX_TEXT,
    block_errors,
    blocks_text_length,
    error_message,
    view_errors,
)
from tests.fakes.slack_events import (
    APP_ID,
    BOT_ID,
    BOT_USER_ID,
    DEFAULT_USER,
    TEAM_ID,
    SignedResponse,
    app_mention,
    assistant_thread_started,
    block_actions,
    event_callback,
    form_payload,
    message,
    message_im,
    next_ts,
    send_signed,
    signed_headers,
    slash_command,
    view_submission,
)
from tests.fakes.socket_gateway import SocketGateway

__all__ = [
    "Call",
    "FakeSlack",
    "SignedResponse",
    "SlackError",
    "app_mention",
    "assistant_thread_started",
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


LOADING_MESSAGES = 10
SUGGESTED_PROMPTS = 4

# The methods that take an app-level token (xapp-) and no other kind, as on Slack.
APP_TOKEN_METHODS = frozenset({"apps.connections.open"})

# Form-encoded clients send these as JSON strings.
JSON_FIELDS = (
    "blocks",
    "attachments",
    "view",
    "metadata",
    "prompts",
    "loading_messages",
    "chunks",
)


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, fraction = ts.partition(".")
    return int(seconds or 0), int(fraction or 0)


# ---------------------------------------------------------------------------------------
# The fake Web API
# ---------------------------------------------------------------------------------------


class Call(NamedTuple):
    method: str
    args: dict[str, Any]
    headers: dict[str, str]


class SlackError(Exception):
    """Raised by a method implementation: the response is `{"ok": false, "error": ...}`."""

    def __init__(self, error: str, messages: Sequence[str] = (), **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.messages = list(messages)
        self.extra = extra

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error": self.error, **self.extra}
        if self.messages:
            body["errors"] = self.messages
            body["response_metadata"] = {"messages": self.messages}
        return body


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)


def _require(args: Mapping[str, Any], *names: str, error: str = "invalid_arguments") -> None:
    missing = [name for name in names if args.get(name) in (None, "")]
    if missing:
        raise SlackError(error, [f"[ERROR] missing required field: {name}" for name in missing])


class FakeSlack(FakeServer[Call]):
    """Slack's Web API on 127.0.0.1; `url` is the `base_url` for WebClient.

    tokens: accepted tokens (default: any `xoxb-`/`xoxp-` token, and `xapp-` app-level
    tokens, which only `apps.connections.open` takes). usergroups: [{"id",
    "handle", "name", "users": [...]}]. gateway: the Socket Mode gateway whose URLs
    `apps.connections.open` hands out (default: one FakeSlack starts on first use and
    stops with itself).
    """

    def __init__(
        self,
        *,
        tokens: Iterable[str] | None = None,
        usergroups: Sequence[Mapping[str, Any]] = (),
        team_id: str = TEAM_ID,
        bot_user_id: str = BOT_USER_ID,
        bot_id: str = BOT_ID,
        app_id: str = APP_ID,
        gateway: SocketGateway | None = None,
    ) -> None:
        super().__init__()
        self.tokens = set(tokens) if tokens is not None else None
        self._gateway = gateway
        self._own_gateway: SocketGateway | None = None
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.app_id = app_id
        self._usergroups: list[dict[str, Any]] = [dict(group) for group in usergroups]
        self._channels: dict[str, list[dict[str, Any]]] = {}
        self._views: dict[str, dict[str, Any]] = {}
        self._home: dict[str, dict[str, Any]] = {}  # user id -> App Home view
        self._assistant: dict[tuple[str, str], dict[str, Any]] = {}
        self._rate_limits: dict[str, list[int]] = {}
        self._server_errors: dict[str, list[int]] = {}
        self._failures: dict[str, list[SlackError | None]] = {}  # None: that call passes
        self._delays: dict[str, list[float]] = {}
        self._view_ids = itertools.count(1)
        self._first_text: dict[str, float] = {}  # message ts -> when it first showed text

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def gateway(self) -> SocketGateway:
        """The Socket Mode gateway `apps.connections.open` points at (started on first use
        when none was given; it stops with FakeSlack then)."""
        with self._cond:
            if self._gateway is None:
                self._gateway = self._own_gateway = SocketGateway(app_id=self.app_id).start()
            return self._gateway

    def stop(self) -> None:
        super().stop()
        with self._cond:
            own, self._own_gateway = self._own_gateway, None
            if own is not None:
                self._gateway = None
        if own is not None:
            own.stop()

    # knobs -----------------------------------------------------------------------------

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """The next `times` calls of `method` get HTTP 429, `Retry-After: retry_after`."""
        with self._cond:
            self._rate_limits[method] = [times, retry_after]

    def server_error(self, method: str, times: int = 1, status: int = 503) -> None:
        """The next `times` calls of `method` get HTTP `status` (a 5xx: Slack's own outage)."""
        with self._cond:
            self._server_errors[method] = [times, status]

    def fail(
        self, method: str, error: str, times: int = 1, *, after: int = 0, **extra: Any
    ) -> None:
        """The next `times` calls of `method` answer `{"ok": false, "error": error}`; with
        `after`, once that many more have been answered as usual."""
        with self._cond:
            self._failures.setdefault(method, []).extend(
                [None] * after + [SlackError(error, **extra) for _ in range(times)]
            )

    def slow(self, method: str, seconds: float, times: int = 1) -> None:
        """The next `times` calls of `method` are answered after `seconds` (a slow, not a
        failing, Slack); other calls meanwhile are answered at once."""
        with self._cond:
            self._delays.setdefault(method, []).extend([seconds] * times)

    def fast(self) -> None:
        """Calls are answered at once again: the delays `slow` set and not yet used go."""
        with self._cond:
            self._delays.clear()

    def reset(self) -> None:
        """Forget calls, messages, views, assistant-thread state and every knob (the
        usergroups stay)."""
        with self._cond:
            self._records.clear()
            for state in (
                self._channels,
                self._views,
                self._home,
                self._assistant,
                self._rate_limits,
                self._server_errors,
                self._failures,
                self._delays,
            ):
                state.clear()

    # seeding ---------------------------------------------------------------------------

    def add_message(
        self,
        channel: str,
        text: str = "",
        *,
        user: str = DEFAULT_USER,
        ts: str | None = None,
        thread_ts: str | None = None,
        **fields: Any,
    ) -> str:
        """Store a message as if a user had posted it; returns its ts."""
        message = {"type": "message", "user": user, "text": text, "team": self.team_id, **fields}
        with self._cond:
            stored = self._store(channel, message, ts=ts or next_ts(), thread_ts=thread_ts)
        return str(stored["ts"])

    def add_usergroup(
        self, group_id: str, handle: str, users: Sequence[str], **fields: Any
    ) -> None:
        group = {"id": group_id, "handle": handle, "users": list(users), **fields}
        with self._cond:
            self._usergroups = [g for g in self._usergroups if g.get("id") != group_id]
            self._usergroups.append(group)

    # inspection ------------------------------------------------------------------------

    @property
    def call_log(self) -> list[Call]:
        return self.records()

    def calls(self, method: str | None = None) -> list[dict[str, Any]]:
        """Argument dicts of the calls made to `method` (all calls when None), in order."""
        return [call.args for call in self.records() if method is None or call.method == method]

    def last(self, method: str) -> dict[str, Any]:
        calls = self.calls(method)
        if not calls:
            seen = sorted({call.method for call in self.records()})
            raise AssertionError(f"FakeSlack: no {method} call; methods called: {seen}")
        return calls[-1]

    def messages(self, channel: str) -> list[dict[str, Any]]:
        """Every stored message of `channel` (thread replies included), oldest first."""
        with self._cond:
            return copy.deepcopy(self._channels.get(channel, []))

    def message(self, channel: str, ts: str) -> dict[str, Any] | None:
        with self._cond:
            found = self._find(channel, ts)
            return copy.deepcopy(found) if found else None

    def thread(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        """The parent and its replies, oldest first."""
        with self._cond:
            return copy.deepcopy(self._thread_messages(channel, thread_ts))

    def view(self, view_id: str) -> dict[str, Any] | None:
        with self._cond:
            found = self._views.get(view_id)
            return copy.deepcopy(found) if found else None

    def first_text_at(self, ts: str) -> float | None:
        """When (time.monotonic) the message `ts` first had text a reader could see: posted
        with it, streamed into it or updated to it."""
        with self._cond:
            return self._first_text.get(ts)

    def assistant_thread(self, channel: str, thread_ts: str) -> dict[str, Any]:
        """What assistant.threads.* set on a thread: status, loading_messages, title, prompts."""
        with self._cond:
            return copy.deepcopy(self._assistant.get((channel, thread_ts), {}))

    def wait_for_call(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """The args of the first `method` call (past or future) matching `predicate`."""

        def found() -> dict[str, Any] | None:
            for args in self.calls(method):
                if predicate is None or predicate(args):
                    return args
            return None

        return self.wait_for(found, timeout)

    def wait_for_message(
        self,
        channel: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """The first stored message of `channel` matching `predicate`, once there is one."""

        def found() -> dict[str, Any] | None:
            for stored in self.messages(channel):
                if predicate is None or predicate(stored):
                    return stored
            return None

        return self.wait_for(found, timeout)

    def describe_records(self) -> str:
        methods = [call.method for call in self._records]
        return f"{len(methods)} call(s): {methods[-15:]}"

    # request handling ------------------------------------------------------------------

    def handle(
        self, method: str, args: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Answer one Web API call: (HTTP status, JSON body, extra headers)."""
        with self._cond:
            delays = self._delays.get(method)
            delay = delays.pop(0) if delays else 0.0
        if delay and not self.pause(delay):  # outside the lock: other calls are answered
            return 503, {"ok": False, "error": "fake_stopping"}, {}
        token = args.pop("token", None)
        authorization = headers.get("authorization", "")
        if authorization.startswith("Bearer "):
            token = authorization.removeprefix("Bearer ").strip()
        for name in JSON_FIELDS:
            value = args.get(name)
            if isinstance(value, str) and value[:1] in ("[", "{"):
                with contextlib.suppress(ValueError):
                    args[name] = json.loads(value)
        with self._cond:
            status, payload, extra = self._answer(method, args, token)
            self._records.append(Call(method, args, headers))
            self._cond.notify_all()
        return status, payload, extra

    def _answer(
        self, method: str, args: dict[str, Any], token: str | None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        limit = self._rate_limits.get(method)
        if limit and limit[0] > 0:
            limit[0] -= 1
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(limit[1])}
        outage = self._server_errors.get(method)
        if outage and outage[0] > 0:
            outage[0] -= 1
            return outage[1], {"ok": False, "error": "fatal_error"}, {}
        if not token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        if not self._valid_token(token):
            return 200, {"ok": False, "error": "invalid_auth"}, {}
        if token.startswith("xapp-") != (method in APP_TOKEN_METHODS):
            return 200, {"ok": False, "error": "not_allowed_token_type"}, {}
        failures = self._failures.get(method)
        failure = failures.pop(0) if failures else None
        if failure is not None:
            return 200, failure.payload(), {}
        implementation = _METHODS.get(method)
        if implementation is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        try:
            return 200, {"ok": True, **implementation(self, args, token)}, {}
        except SlackError as exc:
            return 200, exc.payload(), {}

    def _valid_token(self, token: str) -> bool:
        if self.tokens is not None:
            return token in self.tokens
        return token.startswith(("xoxb-", "xoxp-", "xapp-"))

    # stored state (call with the lock held) --------------------------------------------

    def _store(
        self, channel: str, message: dict[str, Any], *, ts: str, thread_ts: str | None
    ) -> dict[str, Any]:
        message["ts"] = ts
        if thread_ts:
            parent = self._find(channel, thread_ts)
            root = str(parent.get("thread_ts", thread_ts)) if parent else thread_ts
            message["thread_ts"] = root
            root_message = self._find(channel, root)
            if root_message is not None:
                earlier = [
                    m
                    for m in self._channels.get(channel, [])
                    if m.get("thread_ts") == root and m["ts"] != root
                ]
                users = {str(m.get("user")) for m in earlier} | {str(message.get("user"))}
                root_message.update(
                    {
                        "thread_ts": root,
                        "reply_count": len(earlier) + 1,
                        "reply_users": sorted(users),
                        "reply_users_count": len(users),
                        "latest_reply": ts,
                    }
                )
        stored = self._channels.setdefault(channel, [])
        stored.append(message)
        stored.sort(key=lambda m: _ts_key(str(m["ts"])))
        self._note_text(message)
        return message

    def _note_text(self, message: Mapping[str, Any]) -> None:
        if message.get("text") or message.get("blocks"):
            self._first_text.setdefault(str(message["ts"]), time.monotonic())

    def _find(self, channel: str, ts: str) -> dict[str, Any] | None:
        for stored in self._channels.get(channel, []):
            if stored["ts"] == ts:
                return stored
        return None

    def _thread_messages(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self._channels.get(channel, [])
            if m["ts"] == thread_ts or m.get("thread_ts") == thread_ts
        ]

    def _bot_message(self, args: Mapping[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team_id,
            "text": str(args.get("text") or "")[:MAX_TEXT],
        }
        for name in ("blocks", "attachments", "metadata"):
            if args.get(name) is not None:
                message[name] = args[name]
        return message

    def _new_view(self, view: dict[str, Any], *, view_id: str | None = None) -> dict[str, Any]:
        view_id = view_id or f"V{next(self._view_ids):08d}"
        stored = {
            "id": view_id,
            "team_id": self.team_id,
            "type": view.get("type"),
            "blocks": view.get("blocks", []),
            "private_metadata": view.get("private_metadata", ""),
            "callback_id": view.get("callback_id", ""),
            "external_id": view.get("external_id", ""),
            "state": {"values": {}},
            "hash": f"{time.time():.6f}.{view_id}",
            "title": view.get("title"),
            "submit": view.get("submit"),
            "close": view.get("close"),
            "clear_on_close": bool(view.get("clear_on_close", False)),
            "notify_on_close": bool(view.get("notify_on_close", False)),
            "root_view_id": view_id,
            "previous_view_id": None,
            "app_id": self.app_id,
            "bot_id": self.bot_id,
        }
        self._views[view_id] = stored
        return stored


# ---------------------------------------------------------------------------------------
# Method implementations: (fake, args, token) -> response fields. Run with the lock held.
# ---------------------------------------------------------------------------------------

Implementation = Callable[[FakeSlack, dict[str, Any], str], dict[str, Any]]
_METHODS: dict[str, Implementation] = {}


def _method(name: str) -> Callable[[Implementation], Implementation]:
    def register(function: Implementation) -> Implementation:
        _METHODS[name] = function
        return function

    return register


def _check_message_blocks(args: Mapping[str, Any]) -> None:
    blocks = args.get("blocks")
    if blocks is None:
        return
    errors = block_errors(blocks, MAX_MESSAGE_BLOCKS)
    if errors:
        raise SlackError("invalid_blocks", errors)
    if blocks_text_length(blocks) > MAX_BLOCKS_TEXT:
        raise SlackError("msg_blocks_too_long")


def _check_view(view: Any, *, kind: str | None = None) -> dict[str, Any]:
    if not isinstance(view, dict):
        raise SlackError("invalid_arguments", ["[ERROR] missing required field: view"])
    errors = view_errors(view, kind=kind)
    if errors:
        raise SlackError("invalid_arguments", errors)
    return view


@_method("auth.test")
def _auth_test(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "url": "https://fake-workspace.slack.com/",
        "team": "Fake Workspace",
        "user": "switchboard",
        "team_id": fake.team_id,
        "user_id": fake.bot_user_id,
        "is_enterprise_install": False,
    }
    if token.startswith("xoxb-"):
        answer["bot_id"] = fake.bot_id
    return answer


@_method("apps.connections.open")
def _apps_connections_open(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    """A Socket Mode URL with a fresh one-time ticket (checked by the gateway)."""
    return {"url": fake.gateway.issue_url()}


@_method("bots.info")
def _bots_info(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    """Only our own bot is known. (auth.test does not say which app a token is for.)"""
    if str(args.get("bot") or "") != fake.bot_id:
        raise SlackError("bot_not_found")
    icon = "https://fake-workspace.slack.com/icon.png"
    return {
        "bot": {
            "id": fake.bot_id,
            "deleted": False,
            "name": "switchboard",
            "updated": 1_700_000_000,
            "app_id": fake.app_id,
            "user_id": fake.bot_user_id,
            "icons": {"image_36": icon, "image_48": icon, "image_72": icon},
        }
    }


@_method("chat.postMessage")
def _chat_post_message(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    channel = args.get("channel")
    if not channel:
        raise SlackError("channel_not_found")
    if not args.get("text") and not args.get("blocks") and not args.get("attachments"):
        raise SlackError("no_text")
    _check_message_blocks(args)
    message = fake._store(
        str(channel), fake._bot_message(args), ts=next_ts(), thread_ts=args.get("thread_ts")
    )
    return {"channel": channel, "ts": message["ts"], "message": copy.deepcopy(message)}


@_method("conversations.replies")
def _conversations_replies(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    """A thread's parent and replies, oldest first (one page of `limit`, as Slack's)."""
    _require(args, "channel", "ts")
    with fake._cond:
        messages = copy.deepcopy(fake._thread_messages(str(args["channel"]), str(args["ts"])))
    if not messages:
        raise SlackError("thread_not_found")
    limit = int(args.get("limit") or 1000)
    return {"messages": messages[:limit], "has_more": len(messages) > limit}


@_method("chat.update")
def _chat_update(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "channel", "ts")
    message = fake._find(str(args["channel"]), str(args["ts"]))
    if message is None:
        raise SlackError("message_not_found")
    _check_message_blocks(args)
    if "text" in args:
        message["text"] = str(args["text"] or "")[:MAX_TEXT]
    for name in ("blocks", "attachments", "metadata"):
        if name in args:
            message[name] = args[name]
    message["edited"] = {"user": fake.bot_user_id, "ts": next_ts()}
    fake._note_text(message)
    return {
        "channel": args["channel"],
        "ts": message["ts"],
        "text": message.get("text", ""),
        "message": copy.deepcopy(message),
    }


@_method("chat.postEphemeral")
def _chat_post_ephemeral(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    if not args.get("channel"):
        raise SlackError("channel_not_found")
    if not args.get("user"):
        raise SlackError("user_not_in_channel")
    if not args.get("text") and not args.get("blocks") and not args.get("attachments"):
        raise SlackError("no_text")
    _check_message_blocks(args)
    return {"message_ts": next_ts()}


@_method("chat.delete")
def _chat_delete(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "channel", "ts")
    channel, ts = str(args["channel"]), str(args["ts"])
    message = fake._find(channel, ts)
    if message is None:
        raise SlackError("message_not_found")
    fake._channels[channel].remove(message)
    return {"channel": channel, "ts": ts}


@_method("chat.getPermalink")
def _chat_get_permalink(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "channel", "message_ts")
    channel, ts = str(args["channel"]), str(args["message_ts"])
    if fake._find(channel, ts) is None:
        raise SlackError("message_not_found")
    link = f"https://fake-workspace.slack.com/archives/{channel}/p{ts.replace('.', '')}"
    return {"channel": channel, "permalink": link}


def _apply_chunks(message: dict[str, Any], args: Mapping[str, Any]) -> None:
    if args.get("markdown_text"):
        message["text"] = (message.get("text", "") + str(args["markdown_text"]))[:MAX_TEXT]
    for chunk in args.get("chunks") or []:
        if not isinstance(chunk, Mapping):
            continue
        if chunk.get("type") == "markdown_text":
            message["text"] = (message.get("text", "") + str(chunk.get("text", "")))[:MAX_TEXT]
        elif chunk.get("type") == "blocks":
            message.setdefault("blocks", []).extend(chunk.get("blocks") or [])
        else:
            message.setdefault("chunks", []).append(dict(chunk))


def _streaming_message(fake: FakeSlack, args: dict[str, Any]) -> dict[str, Any]:
    _require(args, "channel", "ts")
    message = fake._find(str(args["channel"]), str(args["ts"]))
    if message is None:
        raise SlackError("message_not_found")
    if not message.get("streaming"):
        raise SlackError("message_not_in_streaming_state")
    return message


@_method("chat.startStream")
def _chat_start_stream(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "channel", "thread_ts")
    message = {**fake._bot_message({}), "streaming": True}
    _apply_chunks(message, args)
    stored = fake._store(
        str(args["channel"]), message, ts=next_ts(), thread_ts=str(args["thread_ts"])
    )
    return {"channel": args["channel"], "ts": stored["ts"]}


@_method("chat.appendStream")
def _chat_append_stream(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    message = _streaming_message(fake, args)
    _apply_chunks(message, args)
    fake._note_text(message)
    return {"channel": args["channel"], "ts": message["ts"]}


@_method("chat.stopStream")
def _chat_stop_stream(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    message = _streaming_message(fake, args)
    _check_message_blocks(args)
    _apply_chunks(message, args)
    if args.get("blocks") is not None:
        message["blocks"] = args["blocks"]
    if args.get("metadata") is not None:
        message["metadata"] = args["metadata"]
    message["streaming"] = False
    fake._note_text(message)
    return {"channel": args["channel"], "ts": message["ts"], "message": copy.deepcopy(message)}


@_method("views.open")
def _views_open(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "trigger_id")
    view = _check_view(args.get("view"), kind="modal")
    return {"view": copy.deepcopy(fake._new_view(view))}


@_method("views.push")
def _views_push(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "trigger_id")
    view = _check_view(args.get("view"), kind="modal")
    return {"view": copy.deepcopy(fake._new_view(view))}


@_method("views.update")
def _views_update(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    view_id = args.get("view_id")
    if not view_id and args.get("external_id"):
        view_id = next(
            (v["id"] for v in fake._views.values() if v["external_id"] == args["external_id"]),
            None,
        )
        if view_id is None:
            raise SlackError("not_found")
    if not view_id:
        raise SlackError("invalid_arguments", ["[ERROR] missing required field: view_id"])
    current = fake._views.get(str(view_id))
    if current is None:
        raise SlackError("not_found")
    if args.get("hash") and args["hash"] != current["hash"]:
        raise SlackError("hash_conflict")
    view = _check_view(args.get("view"))
    updated = fake._new_view(view, view_id=str(view_id))
    updated["root_view_id"] = current["root_view_id"]
    return {"view": copy.deepcopy(updated)}


@_method("views.publish")
def _views_publish(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "user_id")
    view = _check_view(args.get("view"), kind="home")
    user_id = str(args["user_id"])
    previous = fake._home.get(user_id)
    if previous and args.get("hash") and args["hash"] != previous["hash"]:
        raise SlackError("hash_conflict")
    stored = fake._new_view(view, view_id=previous["id"] if previous else None)
    fake._home[user_id] = stored
    return {"view": copy.deepcopy(stored)}


def _assistant_state(fake: FakeSlack, args: dict[str, Any]) -> dict[str, Any]:
    _require(args, "channel_id", "thread_ts")
    return fake._assistant.setdefault((str(args["channel_id"]), str(args["thread_ts"])), {})


@_method("assistant.threads.setStatus")
def _assistant_set_status(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    if "status" not in args:
        raise SlackError("invalid_arguments", ["[ERROR] missing required field: status"])
    loading = args.get("loading_messages") or []
    if not isinstance(loading, list) or len(loading) > LOADING_MESSAGES:
        message = f"no more than {LOADING_MESSAGES} items allowed"
        raise SlackError("invalid_arguments", [error_message(message, "/loading_messages")])
    state = _assistant_state(fake, args)
    state["status"] = str(args["status"] or "")
    state["loading_messages"] = loading
    return {}


@_method("assistant.threads.setTitle")
def _assistant_set_title(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "title")
    _assistant_state(fake, args)["title"] = str(args["title"])
    return {}


@_method("assistant.threads.setSuggestedPrompts")
def _assistant_set_prompts(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    prompts = args.get("prompts")
    if not isinstance(prompts, list) or not prompts or len(prompts) > SUGGESTED_PROMPTS:
        message = f"must have between 1 and {SUGGESTED_PROMPTS} items"
        raise SlackError("invalid_arguments", [error_message(message, "/prompts")])
    for n, prompt in enumerate(prompts):
        if not isinstance(prompt, Mapping) or not prompt.get("title") or not prompt.get("message"):
            raise SlackError(
                "invalid_arguments", [error_message("title and message required", f"/prompts/{n}")]
            )
    state = _assistant_state(fake, args)
    state["prompts"] = prompts
    if args.get("title"):
        state["prompts_title"] = args["title"]
    return {}


@_method("usergroups.list")
def _usergroups_list(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    include_users = _flag(args.get("include_users"))
    groups = []
    for group in fake._usergroups:
        users = list(group.get("users", []))
        item = {
            "id": group["id"],
            "team_id": fake.team_id,
            "is_usergroup": True,
            "name": group.get("name", group.get("handle", "")),
            "handle": group.get("handle", ""),
            "description": group.get("description", ""),
            "date_delete": 0,
            "user_count": len(users),
        }
        if include_users:
            item["users"] = users
        groups.append(item)
    return {"usergroups": groups}


@_method("usergroups.users.list")
def _usergroups_users_list(fake: FakeSlack, args: dict[str, Any], token: str) -> dict[str, Any]:
    _require(args, "usergroup")
    for group in fake._usergroups:
        if group["id"] == args["usergroup"]:
            return {"users": list(group.get("users", []))}
    raise SlackError("no_such_subteam")


class _SlackHandler(QuietHandler):
    @property
    def fake(self) -> FakeSlack:
        return cast(FakeSlack, self.server.owner)

    def serve(self, method: str) -> None:
        raw = self.read_body()
        parts = urlsplit(self.path)
        if not parts.path.startswith("/api/"):
            self.send_bytes(404, b"Not Found", "text/plain")
            return
        method = parts.path.removeprefix("/api/").strip("/")
        args: dict[str, Any] = parse_form(parts.query)
        args.update(self._body_args(raw))
        status, payload, headers = self.fake.handle(method, args, self.header_dict())
        self.send_json(status, payload, headers)

    def crash_body(self, error: Exception) -> Any:
        return {"ok": False, "error": "fatal_error", "detail": repr(error)}

    def _body_args(self, raw: bytes) -> dict[str, Any]:
        if not raw:
            return {}
        content_type = (self.headers.get("Content-Type") or "").lower()
        if content_type.startswith("application/json"):
            try:
                parsed = json.loads(raw)
            except ValueError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
        if content_type.startswith("multipart/form-data"):
            return _parse_multipart(raw, self.headers.get("Content-Type", ""))
        return parse_form(raw.decode("utf-8"))


def _parse_multipart(raw: bytes, content_type: str) -> dict[str, Any]:
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    parsed = BytesParser(policy=HTTP).parsebytes(head + raw)
    args: dict[str, Any] = {}
    for part in parsed.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        args[name] = data if part.get_filename() else data.decode("utf-8", "replace")
    return args


FakeSlack.handler_class = _SlackHandler
