"""The Slack implementation of `worker.surface.Surface`: what a run shows in its thread.

Called by the worker that holds the run's lease. Nothing here may end a run: every entry
point logs a failure and returns. Keys this surface reads from `run.origin` (set by the
listeners): `channel`, `thread_ts`, `assistant` ("1" in an assistant thread), `team` (the
workspace: nothing is posted where the app was uninstalled, `bot.installations`); it writes
`status_ts`, the ts of the one status message it keeps updating.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import ParamSpec

import redis
import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from approvals import ApprovalRequest
from bot import messages as m
from bot import reminders
from bot.batch import ITEMS_PER_CARD, batch_card
from bot.blocks import (
    Message,
    answer_messages,
    approval_card,
    is_high_risk,
    outcome_text,
    status_final,
)
from bot.blocks import status_working as status_working_message
from bot.identity import UserGroups, user_groups
from bot.installations import Installations
from bot.mrkdwn import channel as channel_link
from bot.stream import AnswerStreams, StreamedAnswer, flag_ungrounded
from bot.throttle import Throttle
from tools.registry import Tool
from worker.run import EndReason, Run, RunStatus
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

P = ParamSpec("P")

UPDATE_INTERVAL = 1.2  # seconds between chat.update calls for one run (Tier 3: 50+/min)
STATUS_REFRESH = 90.0  # Slack clears an assistant status after 2 minutes
SLACK_ERRORS = (SlackClientError, OSError)  # API errors (incl. 429 after retries), network


def never_raises(method: Callable[P, None]) -> Callable[P, None]:
    """The surface boundary: the worker must never fail a run because Slack did."""

    @functools.wraps(method)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            method(*args, **kwargs)
        except Exception:  # boundary: logged with the traceback, the run goes on
            run = next((a for a in args if isinstance(a, Run)), None)
            log.exception(
                "slack_surface_failed", step=method.__name__, run_id=getattr(run, "id", None)
            )

    return guarded


def with_rate_limit_retries(client: WebClient) -> WebClient:
    """Retry 429s after Slack's Retry-After (opt-in in slack_sdk); at most twice."""
    if not any(isinstance(h, RateLimitErrorRetryHandler) for h in client.retry_handlers):
        client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=2))
    return client


class SlackSurface:
    def __init__(
        self,
        client: WebClient,
        rt: Runtime,
        *,
        update_interval: float = UPDATE_INTERVAL,
        status_refresh: float = STATUS_REFRESH,
    ) -> None:
        self.client = with_rate_limit_retries(client)
        self.rt = rt
        self.installations = Installations(rt.redis, rt.settings.namespace, rt.settings.retention)
        self.throttle = Throttle(update_interval)
        self.status_refresh = status_refresh
        self._refreshers: dict[str, threading.Timer] = {}
        self._groups: UserGroups | None = None  # for reminders: made when first needed
        self._refresh_lock = threading.Lock()
        self.answers = AnswerStreams(self.client, rt.redis, rt.settings.namespace)

    def close(self) -> None:
        """Drop held-back updates and status refreshes (at shutdown)."""
        self.throttle.close_all()
        with self._refresh_lock:
            timers, self._refreshers = list(self._refreshers.values()), {}
        for timer in timers:
            timer.cancel()

    def gone(self, run: Run) -> bool:
        """Was the app uninstalled from (or its token revoked in) the run's workspace?"""
        gone = self.installations.revoked(run.origin.get("team", ""))
        if gone:
            log.info("slack_not_posted", run_id=run.id, team=run.origin.get("team"))
        return gone

    # -- progress -----------------------------------------------------------------------------

    @never_raises
    def progress(self, run: Run, text: str) -> None:
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if not channel or not thread_ts or self.gone(run):
            return
        if run.origin.get("assistant"):
            status = m.ASSISTANT_STATUS.format(text=text)
            self.throttle.offer(run.id, lambda: self._set_status(channel, thread_ts, status))
            self._keep_status(run.id, channel, thread_ts, status)
            return
        message = status_working_message(run, text)
        status_ts = run.origin.get("status_ts")
        if not status_ts:
            response = self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=message.text, blocks=message.blocks
            )
            run.origin["status_ts"] = str(response["ts"])
            self.throttle.touch(run.id)
            return
        self.throttle.offer(run.id, lambda: self._update(channel, status_ts, message))

    def _set_status(self, channel: str, thread_ts: str, status: str) -> None:
        try:
            self.client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread_ts, status=status
            )
        except SLACK_ERRORS:  # also called from timer threads: log, never raise
            log.exception("slack_status_failed", channel=channel)

    def _update(self, channel: str, ts: str, message: Message) -> None:
        try:
            self.client.chat_update(
                channel=channel, ts=ts, text=message.text, blocks=message.blocks
            )
        except SLACK_ERRORS:  # also called from timer threads: log, never raise
            log.exception("slack_update_failed", channel=channel, ts=ts)

    def _keep_status(self, run_id: str, channel: str, thread_ts: str, status: str) -> None:
        """Set the assistant status again before Slack clears it, while the run works."""

        def refresh() -> None:
            with self._refresh_lock:
                if self._refreshers.get(run_id) is not timer:
                    return
            try:
                found = self.rt.store.find(run_id)
            except redis.RedisError:
                log.warning("status_refresh_skipped", run_id=run_id)
                found = None
            if found is None or found.status != RunStatus.RUNNING:
                self._stop_status(run_id)
                return
            self._set_status(channel, thread_ts, status)
            self._keep_status(run_id, channel, thread_ts, status)

        timer = threading.Timer(self.status_refresh, refresh)
        timer.daemon = True
        with self._refresh_lock:
            old = self._refreshers.pop(run_id, None)
            if old is not None:
                old.cancel()
            self._refreshers[run_id] = timer
        timer.start()

    def _stop_status(self, run_id: str) -> None:
        with self._refresh_lock:
            timer = self._refreshers.pop(run_id, None)
        if timer is not None:
            timer.cancel()

    # -- approvals -----------------------------------------------------------------------------

    @never_raises
    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        if self.gone(run):
            return
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if channel:
            card = self.card(request, tool.description)
            self._post_card(request, channel, thread_ts, card)
        elsewhere = self.rt.policy.approvals_channel
        if elsewhere and elsewhere != channel:
            note = m.CARD_FROM_THREAD.format(channel=channel_link(channel)) if channel else None
            self._post_card(request, elsewhere, None, self.card(request, tool.description, note))

    @never_raises
    def approvals_requested(self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]) -> None:
        """One turn's writes on one card (bot.batch), ITEMS_PER_CARD at most per card."""
        if self.gone(run):
            return
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        elsewhere = self.rt.policy.approvals_channel
        for start in range(0, len(requests), ITEMS_PER_CARD):
            group = [request for request, _ in requests[start : start + ITEMS_PER_CARD]]
            batch_id = self.rt.approvals.create_batch(group)
            if channel:
                self._post_card(group, channel, thread_ts, self.batch(batch_id, group), batch_id)
            if elsewhere and elsewhere != channel:
                note = m.CARD_FROM_THREAD.format(channel=channel_link(channel)) if channel else None
                card = self.batch(batch_id, group, note)
                self._post_card(group, elsewhere, None, card, batch_id)

    def batch(
        self, batch_id: str, requests: list[ApprovalRequest], elsewhere: str | None = None
    ) -> Message:
        return batch_card(
            batch_id,
            requests,
            approvers=self.approvers(requests[0]),
            high_risk={r.tool for r in requests if is_high_risk(self.rt.policy, r.tool)},
            descriptions={
                r.tool: tool.description
                for r in requests
                if (tool := self.rt.registry.get(r.tool)) is not None
            },
            elsewhere=elsewhere,
        )

    def _post_card(
        self,
        request: ApprovalRequest | list[ApprovalRequest],
        channel: str,
        thread_ts: str | None,
        card: Message,
        batch_id: str = "",
    ) -> None:
        requests = request if isinstance(request, list) else [request]
        try:
            response = self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=card.text, blocks=card.blocks
            )
        except SLACK_ERRORS:  # one place failing must not stop the card in the other
            log.exception("approval_card_failed", approval_id=requests[0].id, channel=channel)
            return
        where = {"channel": str(response["channel"]), "ts": str(response["ts"])}
        if batch_id:
            where["batch"] = batch_id
        for each in requests:
            self.rt.approvals.add_card(each.id, where)

    def card(
        self,
        request: ApprovalRequest,
        description: str | None = None,
        elsewhere: str | None = None,
        outcome: str | None = None,
    ) -> Message:
        tool = self.rt.registry.get(request.tool)
        if description is None:
            description = tool.description if tool is not None else ""
        return approval_card(
            request,
            description=description,
            approvers=self.approvers(request),
            high_risk=is_high_risk(self.rt.policy, request.tool),
            elsewhere=elsewhere,
            outcome=outcome,
        )

    def approvers(self, request: ApprovalRequest) -> str:
        """Who may decide, in words; an escalated request names its escalation roles too."""
        text = self.rt.policy.approvers_text(request.tool)
        if request.escalated:
            with contextlib.suppress(KeyError):
                roles = self.rt.policy.rule(request.tool).escalate_to
                text += m.CARD_ESCALATED.format(roles=", ".join("@" + r for r in roles))
        return text

    @never_raises
    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        if self.gone(run):
            return
        reason = run.reason  # not set yet when the loop withdraws a cancelled run's requests
        if reason is None and self.rt.store.cancel_requested_by(run.id):
            reason = EndReason.CANCELLED
        self.show_outcome(request, reason)

    def show_outcome(
        self,
        request: ApprovalRequest,
        run_reason: EndReason | None = None,
        also: dict[str, str] | None = None,
    ) -> None:
        """Update every card of `request` in place: the outcome instead of the buttons (a
        pending request's cards are drawn again as they stand, e.g. once escalated).
        `also` is the card that was clicked, in case it was not recorded yet."""
        outcome = outcome_text(request, run_reason) if request.decided else None
        cards = list(request.cards)
        known = {(c.get("channel"), c.get("ts")) for c in cards}
        if also and also.get("channel") and (also["channel"], also.get("ts")) not in known:
            cards.append(also)
        for card in cards:
            note = None
            if card["channel"] != request.channel_id and request.channel_id:
                note = m.CARD_FROM_THREAD.format(channel=channel_link(request.channel_id))
            batch = self.rt.approvals.batch(card["batch"]) if card.get("batch") else []
            if batch:  # the batch card again, every item as it stands now
                message = self.batch(card["batch"], batch, note)
            else:
                message = self.card(request, elsewhere=note, outcome=outcome)
            try:
                self.client.chat_update(
                    channel=card["channel"], ts=card["ts"], text=message.text, blocks=message.blocks
                )
            except SLACK_ERRORS:  # each card on its own: a deleted message must not stop the rest
                log.exception("approval_card_update_failed", approval_id=request.id, **card)

    def approval_reminder(self, run: Run, request: ApprovalRequest, *, escalated: bool) -> None:
        self.approval_reminders(run, [request], escalated=escalated)

    @never_raises
    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        """DM the people who may decide the requests of one card, with a link to it: one DM
        per person, at most one a minute per person (bot.reminders)."""
        if self.gone(run):
            return
        if self._groups is None:
            self._groups = user_groups(self.rt, self.client)
        kind = "escalated" if escalated else "reminded"
        reminders.remind(
            self.client,
            self.rt.policy,
            self._groups,
            requests,
            escalated=escalated,
            may_tell=lambda person: self.first_dm_in_a_while(person, kind),
            hold=lambda person, held: self.hold_for_digest(person, held, kind),
        )
        if escalated:  # the cards say who may decide now: each card drawn once
            drawn: set[tuple[str, str]] = set()
            for request in requests:
                cards = {(c["channel"], c["ts"]) for c in request.cards}
                if cards and cards <= drawn:
                    continue
                drawn |= cards
                self.show_outcome(request)

    def hold_for_digest(self, person: str, requests: list[ApprovalRequest], kind: str) -> None:
        """Keep the calls a capped person was not told of, and queue (once per interval) the
        job that DMs them together when the interval is over (bot.reminders.send_digest)."""
        keys, held = self.rt.store.keys, self.rt.store.keys.person(person, kind + ":held")
        if self.rt.redis.scard(held) < reminders.DIGEST_HELD:
            pipe = self.rt.redis.pipeline(transaction=False)
            pipe.sadd(held, *[r.id for r in requests])
            pipe.expire(held, int(self.rt.settings.approval_ttl))
            pipe.execute()
        due = keys.person(person, kind + ":digest")
        if self.rt.redis.set(due, "1", nx=True, ex=reminders.REMINDER_INTERVAL):
            self.rt.queue.enqueue_in(
                timedelta(seconds=reminders.REMINDER_INTERVAL),
                "bot.reminders.send_digest",
                person,
                kind,
                job_id=f"digest-{kind}-{person}",
            )

    def digest(self, person: str, kind: str) -> str:
        """DM `person` the calls held back from them that still wait for them to decide."""
        held = self.rt.store.keys.person(person, kind + ":held")
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.smembers(held)
        pipe.delete(held)
        ids = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()[0])
        if self._groups is None:
            self._groups = user_groups(self.rt, self.client)
        escalated = kind == "escalated"
        waiting = [
            r
            for r in (self.rt.approvals.find(i) for i in ids)
            if r is not None
            and not r.decided
            and not self.installations.revoked(r.team_id)
            and person in reminders.recipients(self.rt.policy, self._groups, r, escalated=escalated)
        ]
        if not waiting:
            return "nothing waits"
        if not self.first_dm_in_a_while(person, kind):  # told of another card meanwhile
            self.hold_for_digest(person, waiting, kind)
            return "held again"
        text = reminders.digest_text(self.client, waiting, escalated)
        try:
            self.client.chat_postMessage(channel=person, text=text, unfurl_links=False)
        except SLACK_ERRORS as exc:
            log.info("reminder_digest_not_sent", user=person, error=type(exc).__name__)
            return "not sent"
        log.info("reminder_digest_sent", user=person, calls=len(waiting), escalated=escalated)
        return "sent"

    def first_dm_in_a_while(self, person: str, kind: str) -> bool:
        """True for the first `kind` DM to `person` in REMINDER_INTERVAL seconds (one key
        in Redis, so every worker process shares the cap)."""
        key = self.rt.store.keys.person(person, kind)
        return bool(self.rt.redis.set(key, "1", nx=True, ex=reminders.REMINDER_INTERVAL))

    # -- the answer as it is written (bot/stream.py) -----------------------------------------

    def answer_stream(self, run: Run) -> StreamedAnswer | None:
        """Where the model's answer text goes while it writes it (`worker.streaming`)."""
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if not channel or not thread_ts or self.gone(run):
            return None
        return self.answers.open(run, channel, thread_ts)

    # -- the end --------------------------------------------------------------------------------

    @never_raises
    def finished(self, run: Run) -> None:
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        self._stop_status(run.id)
        sending = self.throttle.close(run.id)
        streamed = self.answers.take(run.id)
        if not channel or not thread_ts or self.gone(run):
            return
        cancelled_by = None
        if run.reason == EndReason.CANCELLED:
            cancelled_by = self.rt.store.cancel_requested_by(run.id)
        with sending or contextlib.nullcontext():
            self._final_status(run, channel, thread_ts, cancelled_by)
        messages = flag_ungrounded(answer_messages(run, cancelled_by), run)
        if self.answers.finish(run, streamed, messages):
            return
        for message in messages:
            self.client.chat_postMessage(
                channel=channel,
                thread_ts=thread_ts,
                text=message.text,
                blocks=message.blocks,
                unfurl_links=False,
                unfurl_media=False,
            )

    def _final_status(
        self, run: Run, channel: str, thread_ts: str, cancelled_by: str | None
    ) -> None:
        if run.origin.get("assistant"):
            self._set_status(channel, thread_ts, "")
            return
        status_ts = run.origin.get("status_ts")
        if status_ts:
            self._update(channel, status_ts, status_final(run, cancelled_by))
