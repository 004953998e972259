"""The answer, shown in the thread while the model writes it.

Slack's chat streaming (`chat.startStream` / `appendStream` / `stopStream`) when the workspace
allows it; where Slack refuses (an app without the AI feature, an old workspace, any error on
start), the text is posted and then updated instead (`chat.postMessage` + `chat.update`), and
that workspace is not asked to stream again for a while.

What people see at the end is exactly what they would have seen without streaming: when the
run ends, the stream is stopped and the message updated in place to `answer_messages` (the
answer as mrkdwn blocks, the grounding flag, the footer), further messages following for a
long answer. So a partial run, notes, a cut answer or a model that failed midway all end the
same way streamed or not; if that update fails, the streamed message is deleted and the ending
posted as usual. While streaming, the model's text is escaped (nobody pinged, nothing forged)
and a Markdown link is held back until it is complete, then sent as is or, when its label names
another address than it opens, as the bare address.

Bounds: one append per `interval` per message (one update per `update_interval` when posting,
Tier 3), at most `MAX_SENDS` per message and `MAX_SHOWN` characters shown while streaming; the
rest comes with the final message. A tool-call turn's preamble seldom reaches `START_CHARS`
before its first tool-call delta, so it is seldom shown; when it is, the message is taken back.

Durability: a message being streamed is recorded in Redis (`{ns}slack:answer:{run_id}`) when it
starts. A worker that dies midway leaves that record; whoever works the run next finds it before
its own model call (or at the end) and stops and deletes the half-written message, so no message
stays "streaming" and the answer is written again, whole, by the rerun.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from typing import Any

import redis
import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.render import messages as m
from bot.render.blocks import Message, context
from bot.render.mrkdwn import escape, one_line, safe_links, to_mrkdwn
from worker.keys import Keys
from worker.run import Run

log = structlog.get_logger(__name__)

# What a Slack call may raise: its API's errors (429 and 5xx after the client's retries too),
# the network's (OSError), and a reply cut short or garbled (http.client's HTTPException).
SLACK_ERRORS = (SlackClientError, OSError, http.client.HTTPException)
STREAM_INTERVAL = 0.8  # s between appends to one streamed message: at most 75 a minute
UPDATE_INTERVAL = 1.2  # s between chat.update calls when posting instead (Tier 3: 50+/min)
START_CHARS = 40  # the message starts once this much text is in...
START_WAIT = 0.4  # ...or this long after the first words
MAX_SHOWN = 8000  # characters shown while the model writes; the rest comes at the end
MAX_SENDS = 100  # appends (or updates) per message
REFUSED_FOR = 900.0  # s a workspace that refused streaming is posted to instead
TRANSIENT = {"ratelimited", "internal_error", "fatal_error", "service_unavailable"}  # not refusals
RECORD_TTL = 2 * 24 * 3600  # s a record of a message being streamed is kept


class AnswerStreams:
    """The answers being shown while written, one per run, for one Slack surface."""

    def __init__(
        self,
        client: WebClient,
        connection: redis.Redis,
        namespace: str,
        *,
        interval: float = STREAM_INTERVAL,
        update_interval: float = UPDATE_INTERVAL,
    ) -> None:
        self.client, self.redis, self.ns = client, connection, namespace
        self.keys = Keys(namespace)
        self.interval, self.update_interval = interval, update_interval
        self._open: dict[str, StreamedAnswer] = {}
        self._refused: dict[str, float] = {}  # team -> when it refused streaming
        self._lock = threading.Lock()

    def open(self, run: Run, channel: str, thread_ts: str) -> StreamedAnswer:
        """A sink for this model call's answer text. A message an earlier call (or an earlier
        worker) of the run left being written is retired first."""
        earlier = self.take(run.id)
        if earlier is not None:
            earlier.reset()
        self.retire_leftover(run.id)
        team = run.origin.get("team", "")
        return StreamedAnswer(self, run, channel, thread_ts, stream=not self.refused(team))

    def started(self, answer: StreamedAnswer) -> None:
        """Only answers with a message are kept (until the run ends or the text is taken
        back), so runs that suspend or move to another worker leave nothing behind here."""
        with self._lock:
            self._open[answer.run_id] = answer

    def dropped(self, answer: StreamedAnswer) -> None:
        with self._lock:
            if self._open.get(answer.run_id) is answer:
                del self._open[answer.run_id]

    def take(self, run_id: str) -> StreamedAnswer | None:
        with self._lock:
            return self._open.pop(run_id, None)

    def finish(self, run: Run, answer: StreamedAnswer | None, messages: list[Message]) -> bool:
        """Show the run's ending in the streamed message. False: nothing was shown, post
        `messages` as usual."""
        if answer is None:
            self.retire_leftover(run.id)
            return False
        return answer.finish(run, messages)

    def refused(self, team: str) -> bool:
        at = self._refused.get(team)
        return at is not None and time.monotonic() - at < REFUSED_FOR

    def remember_refusal(self, team: str) -> None:
        self._refused[team] = time.monotonic()

    def record(self, run_id: str, where: dict[str, str]) -> None:
        self.redis.set(self.keys.slack_answer(run_id), json.dumps(where), ex=RECORD_TTL)

    def forget(self, run_id: str) -> None:
        self.redis.delete(self.keys.slack_answer(run_id))

    def retire_leftover(self, run_id: str) -> None:
        """A message an earlier worker of this run left being written: stop and delete it."""
        raw = self.redis.get(self.keys.slack_answer(run_id))
        if raw is None:
            return
        try:
            where = json.loads(raw)
        except ValueError:
            where = None
        if isinstance(where, dict) and where.get("channel") and where.get("ts"):
            log.info("answer_stream_leftover", run_id=run_id, ts=where["ts"])
            self.retire(where)
        self.forget(run_id)

    def retire(self, where: dict[str, Any]) -> None:
        """Stop (when streamed) and delete a message that is not the answer; if it cannot be
        deleted, say in it that it was replaced."""
        channel, ts = str(where["channel"]), str(where["ts"])
        if where.get("mode") == "stream":
            try:
                self.client.chat_stopStream(channel=channel, ts=ts)
            except SLACK_ERRORS:  # already stopped, or expired: deleting is what matters
                log.info("answer_stream_stop_failed", channel=channel, ts=ts)
        try:
            self.client.chat_delete(channel=channel, ts=ts)
        except SLACK_ERRORS:
            log.warning("answer_stream_delete_failed", channel=channel, ts=ts)
            try:
                self.client.chat_update(channel=channel, ts=ts, text=m.ANSWER_REPLACED, blocks=[])
            except SLACK_ERRORS:
                log.exception("answer_stream_replace_failed", channel=channel, ts=ts)


class StreamedAnswer:
    """The `TextSink` for one run's model call: batches text into a streamed (or posted and
    updated) message. Called from the worker thread that works the run."""

    def __init__(
        self, streams: AnswerStreams, run: Run, channel: str, thread_ts: str, *, stream: bool
    ) -> None:
        self.streams, self.run_id = streams, run.id
        self.channel, self.thread_ts = channel, thread_ts
        self.team, self.user = run.origin.get("team", ""), run.requester.user_id
        self.stream = stream
        self._reset_state()

    def _reset_state(self) -> None:
        self.received = ""  # what the model wrote, up to MAX_SHOWN
        self.sent = 0  # characters of it shown
        self.ts: str | None = None
        self.first_at: float | None = None
        self.last_send = 0.0
        self.sends = 0
        self.broken = False  # Slack failed midway: nothing more until the end

    @property
    def mode(self) -> str:
        return "stream" if self.stream else "post"

    # -- TextSink ----------------------------------------------------------------------------

    def text(self, delta: str) -> None:
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
        room = MAX_SHOWN - len(self.received)
        if room > 0:
            self.received += delta[:room]
        self._send(now)

    def reset(self) -> None:
        if self.ts is not None:
            self.streams.dropped(self)
            self.streams.retire({"channel": self.channel, "ts": self.ts, "mode": self.mode})
            self.streams.forget(self.run_id)
        self._reset_state()

    # -- sending -------------------------------------------------------------------------------

    def _send(self, now: float) -> None:
        ready = settled(self.received, self.sent) if self.stream else len(self.received)
        if self.broken or self.sends >= MAX_SENDS or self.sent >= ready:
            return
        if self.ts is None:
            assert self.first_at is not None
            held = len(self.received.strip()) < START_CHARS and now - self.first_at < START_WAIT
            if held or not self.received.strip():
                return
            self._start()
            return
        if now - self.last_send < (
            self.streams.interval if self.stream else self.streams.update_interval
        ):
            return
        try:
            if self.stream:
                self.streams.client.chat_appendStream(
                    channel=self.channel,
                    ts=self.ts,
                    markdown_text=streamable(self.received[self.sent : ready]),
                )
            else:
                self.streams.client.chat_update(
                    channel=self.channel, ts=self.ts, text=to_mrkdwn(self.received)
                )
        except SLACK_ERRORS:  # rate limited past retries, expired stream...: finish at the end
            log.warning("answer_stream_append_failed", run_id=self.run_id, mode=self.mode)
            self.broken = True
            return
        self._sent(now, ready)

    def _start(self) -> None:
        ready = settled(self.received, 0)
        if self.stream:
            try:
                response = self.streams.client.chat_startStream(
                    channel=self.channel,
                    thread_ts=self.thread_ts,
                    markdown_text=streamable(self.received[:ready]),
                    recipient_team_id=self.team or None,
                    recipient_user_id=self.user or None,
                )
                self.ts = str(response["ts"])
            except SLACK_ERRORS as exc:
                error = exc.response.get("error") if isinstance(exc, SlackApiError) else None
                log.info("answer_stream_refused", run_id=self.run_id, error=error)
                if error is not None and error not in TRANSIENT:
                    self.streams.remember_refusal(self.team)
                self.stream = False
        if not self.stream:
            try:
                response = self.streams.client.chat_postMessage(
                    channel=self.channel,
                    thread_ts=self.thread_ts,
                    text=to_mrkdwn(self.received),
                    unfurl_links=False,
                    unfurl_media=False,
                )
                self.ts = str(response["ts"])
            except SLACK_ERRORS:
                log.warning("answer_post_failed", run_id=self.run_id)
                self.broken = True
                return
        self.streams.record(
            self.run_id, {"channel": self.channel, "ts": str(self.ts), "mode": self.mode}
        )
        self.streams.started(self)
        self._sent(time.monotonic(), ready if self.stream else len(self.received))

    def _sent(self, now: float, upto: int) -> None:
        self.sent = upto
        self.last_send = now
        self.sends += 1

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, run: Run, messages: list[Message]) -> bool:
        if self.ts is None:
            return False
        where = {"channel": self.channel, "ts": self.ts, "mode": self.mode}
        try:
            self._finish(run, messages)
        except SLACK_ERRORS:
            log.exception("answer_stream_finish_failed", run_id=run.id, mode=self.mode)
            self.streams.retire(where)  # the caller posts the whole answer instead
            return False
        finally:
            try:
                self.streams.forget(run.id)
            except redis.RedisError:  # shown: the record lapses on its own (RECORD_TTL).
                # Raised, the run would be said again, the answer shown twice (found by review)
                log.warning("answer_stream_record_kept", run_id=run.id)
        return True

    def _finish(self, run: Run, messages: list[Message]) -> None:
        """Stop the stream, then show the ending exactly as it is posted without streaming:
        the answer as blocks (mrkdwn, safe links, cut and split as Slack accepts), the flags,
        the footer; any further messages follow."""
        client, channel, ts = self.streams.client, self.channel, self.ts
        assert ts is not None
        if self.stream:
            try:
                client.chat_stopStream(channel=channel, ts=ts)
            except SLACK_ERRORS:  # expired or stopped already: the update below is what counts
                log.warning("answer_stream_stop_failed", run_id=run.id)
        first, *more = messages
        client.chat_update(channel=channel, ts=ts, text=first.text, blocks=first.blocks)
        for message in more:
            client.chat_postMessage(
                channel=channel,
                thread_ts=self.thread_ts,
                text=message.text,
                blocks=message.blocks,
                unfurl_links=False,
                unfurl_media=False,
            )


# A Markdown link is sent only once it is complete, so a misleading one can be defused first.
_OPEN_LINK = re.compile(r"\[[^\[\]\n|]{0,300}")
_URL_SO_FAR = re.compile(r"|h|ht|htt|https?|https?:|https?:/|https?://[^\s()<>|]{0,1500}")


def settled(text: str, start: int) -> int:
    """How far `text` can be sent from `start`: up to a "[" that may still open a link."""
    at = text.find("[", start)
    while at != -1:
        opened = _OPEN_LINK.match(text, at)
        assert opened is not None
        rest = text[opened.end() :]
        if (
            rest == ""
            or rest == "]"
            or (rest.startswith("](") and _URL_SO_FAR.fullmatch(rest[2:]) is not None)
        ):
            return at  # still writing the link (or its label): wait for the rest
        at = text.find("[", at + 1)
    return len(text)


def streamable(markdown: str) -> str:
    """Model text as streamed to Slack: its three control characters escaped (nobody is
    pinged, nothing is forged), misleading links written as the address they open."""
    return escape(safe_links(markdown))


def flag_ungrounded(messages: list[Message], run: Run) -> list[Message]:
    """Facts in the answer that no tool result or question has (figures, ids, names) are
    flagged above the footer, streamed or not: a reader must not take them for looked up."""
    if run.ungrounded and run.answer and messages:
        facts = ", ".join(one_line(f, 80) for f in run.ungrounded[:10])
        only_numbers = run.grounding is None or run.grounding.facts == run.grounding.numbers
        what = m.UNGROUNDED_NUMBERS if only_numbers else m.UNGROUNDED_OTHER
        last = messages[-1].blocks
        last.insert(max(0, len(last) - 2), context(m.UNGROUNDED.format(what=what, facts=facts)))
    return messages
