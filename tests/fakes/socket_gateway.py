"""SocketGateway: Slack's Socket Mode gateway as a local WebSocket server (the `websockets`
package, in threads), for the real slack_sdk SocketModeClient that Bolt's handler runs.

    with SocketGateway() as gateway:
        url = gateway.issue_url()          # what apps.connections.open answers (FakeSlack)
        ...                                # the client connects and gets "hello"
        envelope_id = gateway.push_event(event_callback(app_mention("<@UBOT> hi")))
        ack = gateway.wait_for_ack(envelope_id)

It speaks the protocol as Slack documents it: a connection needs a ticket from
`apps.connections.open` (one use each), gets `{"type": "hello", ...}` first, then envelopes
`{"envelope_id", "type", "payload", "accepts_response_payload", "retry_attempt",
"retry_reason"}` that the client acknowledges with `{"envelope_id", "payload"?}`. A
`{"type": "disconnect"}` asks the client to open a new connection. Pings are answered
with pongs (by `websockets`) and counted. Envelopes go to the newest open connection.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any, NamedTuple, Self, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from tests.fakes.slack_events import APP_ID

T = TypeVar("T")

PATH = "/link/"
# interactive payloads whose ack may carry a response (errors, options); Slack says so per
# envelope with `accepts_response_payload`
RESPONDING_INTERACTIONS = ("view_submission", "block_suggestion")


class Ack(NamedTuple):
    """What the client sent back for an envelope."""

    envelope_id: str
    payload: dict[str, Any] | None  # None for a bare ack
    seconds: float | None  # from the push to the ack (None: no such envelope was pushed)
    connection: int  # which connection (1, 2, ...) it came on


class Pushed(NamedTuple):
    envelope_id: str
    type: str
    connection: int
    at: float  # time.monotonic() of the push


class SocketGateway:
    """Slack's Socket Mode endpoint on ws://127.0.0.1:PORT/link/?ticket=...

    Every change of state wakes `wait_for` waiters. `connections` counts the connections
    that got their hello; `acks()` lists what came back, in order.
    """

    def __init__(self, *, app_id: str = APP_ID, ping_interval: float | None = 20) -> None:
        self.app_id = app_id
        self.ping_interval = ping_interval
        self._cond = threading.Condition()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._tickets: set[str] = set()
        self._open: dict[int, ServerConnection] = {}  # number -> connection
        self._numbers = itertools.count(1)
        self._connections = 0
        self._refused = 0
        self._pings = 0
        self._pushed: list[Pushed] = []
        self._waiting: dict[str, list[Pushed]] = {}  # envelope id -> pushes not yet acked
        self._acks: list[Ack] = []
        self._messages: list[Any] = []  # anything else the client sent

    # lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            return self
        gateway = self

        class _Connection(ServerConnection):
            def process_event(self, event: Any) -> None:
                if isinstance(event, Frame) and event.opcode is Opcode.PING:
                    gateway._note_ping()  # websockets answers it with a pong
                super().process_event(event)

        self._server = serve(
            self._serve_connection,
            "127.0.0.1",
            0,
            process_request=self._check_ticket,
            ping_interval=self.ping_interval,
            create_connection=_Connection,
            compression=None,  # slack_sdk's builtin client does not negotiate extensions
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"SocketGateway:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        with self._cond:
            still_open = list(self._open.values())
        for connection in still_open:
            connection.close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("SocketGateway is not started; use start() or `with`")
        return int(self._server.socket.getsockname()[1])

    def issue_url(self) -> str:
        """A URL with a new one-time ticket, as apps.connections.open answers it."""
        ticket = secrets.token_hex(16)
        with self._cond:
            self._tickets.add(ticket)
        return f"ws://127.0.0.1:{self.port}{PATH}?ticket={ticket}"

    # what a test sends -----------------------------------------------------------------

    def push(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        envelope_id: str | None = None,
        accepts_response_payload: bool = False,
        retry_attempt: int = 0,
        retry_reason: str = "",
        timeout: float = 10.0,
    ) -> str:
        """Send one envelope on the newest connection (waiting up to `timeout` for one);
        returns its envelope_id. Pass the same `envelope_id` again to deliver it again."""
        envelope_id = envelope_id or f"fake-envelope-{secrets.token_hex(8)}"
        number, connection = self.wait_for(self._newest, timeout)
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": dict(payload),
            "accepts_response_payload": accepts_response_payload,
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }
        with self._cond:
            pushed = Pushed(envelope_id, kind, number, time.monotonic())
            self._pushed.append(pushed)
            self._waiting.setdefault(envelope_id, []).append(pushed)
        connection.send(json.dumps(envelope))
        return envelope_id

    def push_event(self, body: Mapping[str, Any], **options: Any) -> str:
        """An Events API delivery: `body` is the event_callback (see `event_callback`)."""
        return self.push("events_api", body, **options)

    def push_interactive(self, body: str | Mapping[str, Any], **options: Any) -> str:
        """A click, modal submission, shortcut...: `body` is the payload, or the form body
        the HTTP builders make (`payload=<json>`); Socket Mode sends the JSON itself."""
        payload = _form_json(body) if isinstance(body, str) else dict(body)
        responding = payload.get("type") in RESPONDING_INTERACTIONS
        options.setdefault("accepts_response_payload", responding)
        return self.push("interactive", payload, **options)

    def push_command(self, body: str | Mapping[str, Any], **options: Any) -> str:
        """A slash command: `body` is its fields, or the form body `slash_command` makes."""
        payload = _form_fields(body) if isinstance(body, str) else dict(body)
        options.setdefault("accepts_response_payload", True)
        return self.push("slash_commands", payload, **options)

    def disconnect(self, reason: str = "refresh_requested") -> int:
        """Ask the client on the newest connection to reconnect, as Slack does every few
        hours (`refresh_requested`) or before a restart (`warning`); returns that
        connection's number. The connection stays open until the client closes it."""
        number, connection = self.wait_for(self._newest)
        message = {
            "type": "disconnect",
            "reason": reason,
            "debug_info": {"host": "fake-gateway"},
        }
        connection.send(json.dumps(message))
        return number

    def drop(self) -> None:
        """Close every open connection from the gateway's side (no disconnect message)."""
        with self._cond:
            still_open = list(self._open.values())
        for connection in still_open:
            connection.close()

    # what a test reads -----------------------------------------------------------------

    @property
    def connections(self) -> int:
        """Connections opened with a valid ticket (each got its hello)."""
        with self._cond:
            return self._connections

    @property
    def open_connections(self) -> int:
        with self._cond:
            return len(self._open)

    @property
    def refused(self) -> int:
        """Handshakes refused for a missing, unknown or used ticket."""
        with self._cond:
            return self._refused

    @property
    def pings(self) -> int:
        with self._cond:
            return self._pings

    def pushed(self) -> list[Pushed]:
        with self._cond:
            return list(self._pushed)

    def acks(self, envelope_id: str | None = None) -> list[Ack]:
        with self._cond:
            return [a for a in self._acks if envelope_id is None or a.envelope_id == envelope_id]

    def messages(self) -> list[Any]:
        """What the client sent that was not an ack."""
        with self._cond:
            return list(self._messages)

    def wait_for(self, predicate: Callable[[], T | None], timeout: float = 10.0) -> T:
        """Block until `predicate()` is truthy (re-checked on every change); return it."""
        with self._cond:
            result = self._cond.wait_for(predicate, timeout=timeout)
            if result:
                return result
            summary = self._describe()
        raise TimeoutError(f"SocketGateway: condition not met within {timeout} s; {summary}")

    def wait_for_ack(self, envelope_id: str, count: int = 1, timeout: float = 10.0) -> Ack:
        """The `count`-th ack of `envelope_id`, once it has come."""

        def acked() -> Ack | None:
            found = [a for a in self._acks if a.envelope_id == envelope_id]
            return found[count - 1] if len(found) >= count else None

        return self.wait_for(acked, timeout)

    def wait_for_connections(self, count: int, timeout: float = 10.0) -> int:
        return self.wait_for(lambda: self._connections >= count and self._connections, timeout)

    # serving (websockets' threads) -----------------------------------------------------

    def _check_ticket(self, connection: ServerConnection, request: Request) -> Response | None:
        parts = urlsplit(request.path)
        ticket = (parse_qs(parts.query).get("ticket") or [""])[0]
        with self._cond:
            valid = parts.path == PATH and ticket in self._tickets
            self._tickets.discard(ticket)
            if not valid:
                self._refused += 1
                self._cond.notify_all()
        if not valid:
            return connection.respond(HTTPStatus.UNAUTHORIZED, "invalid or used ticket\n")
        return None

    def _serve_connection(self, connection: ServerConnection) -> None:
        with self._cond:
            number = next(self._numbers)
        hello = {
            "type": "hello",
            "num_connections": self.open_connections + 1,
            "debug_info": {
                "host": "fake-gateway",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.app_id},
        }
        try:
            connection.send(json.dumps(hello))
            with self._cond:
                self._open[number] = connection
                self._connections += 1
                self._cond.notify_all()
            for message in connection:
                self._received(number, message)
        except ConnectionClosed:
            pass
        finally:
            with self._cond:
                self._open.pop(number, None)
                self._cond.notify_all()

    def _received(self, number: int, message: str | bytes) -> None:
        now = time.monotonic()
        try:
            data = json.loads(message)
        except ValueError:
            data = message
        with self._cond:
            if isinstance(data, dict) and isinstance(data.get("envelope_id"), str):
                envelope_id = data["envelope_id"]
                waiting = self._waiting.get(envelope_id) or []
                pushed = waiting.pop(0) if waiting else None
                seconds = now - pushed.at if pushed else None
                payload = data.get("payload")
                self._acks.append(Ack(envelope_id, payload, seconds, number))
            else:
                self._messages.append(data)
            self._cond.notify_all()

    def _note_ping(self) -> None:
        with self._cond:
            self._pings += 1
            self._cond.notify_all()

    def _newest(self) -> tuple[int, ServerConnection] | None:
        if not self._open:
            return None
        number = max(self._open)
        return number, self._open[number]

    def _describe(self) -> str:
        return (
            f"{self._connections} connection(s), {len(self._open)} open, "
            f"{len(self._pushed)} pushed, {len(self._acks)} ack(s), {self._refused} refused"
        )


def _form_json(body: str) -> dict[str, Any]:
    """The JSON of an interactivity form body (`payload=<url-encoded JSON>`)."""
    [payload] = parse_qs(body, keep_blank_values=True)["payload"]
    parsed = json.loads(payload)
    if not isinstance(parsed, dict):
        raise ValueError("the payload is not a JSON object")
    return parsed


def _form_fields(body: str) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(body, keep_blank_values=True).items()}
