"""The Slack implementation of `worker.surface.Surface`: what a run shows in its thread.

Called by the worker that holds the run's lease, always through `worker.surface.Guarded`
(the one guard: a failure here is logged there and never ends a run). Keys this surface
reads from `run.origin` (set by the listeners): `channel`, `thread_ts`, `assistant` ("1" in
an assistant thread), `team` (the workspace: nothing is posted where the app was
uninstalled, `bot.state.installations`); it writes `status_ts`, the ts of the one status
message it keeps updating."""

from __future__ import annotations

import contextlib
import http.client
import threading
import time
from datetime import timedelta
from typing import ParamSpec

import redis
import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator

from approvals import ApprovalRequest
from bot.outbound import reminder_dms as reminders
from bot.outbound.answers import SLACK_ERRORS, AnswerStreams, StreamedAnswer, flag_ungrounded
from bot.outbound.throttle import Throttle
from bot.render import messages as m
from bot.render.batch_card import ITEMS_PER_CARD, batch_card
from bot.render.blocks import (
    Message,
    answer_messages,
    approval_card,
    outcome_text,
    status_final,
)
from bot.render.blocks import status_working as status_working_message
from bot.render.connections import connect_prompt
from bot.render.grants import covered_message, grant_buttons
from bot.render.mrkdwn import channel as channel_link
from bot.state.identity import UserGroups, user_groups
from bot.state.installations import Installations
from tools.registry import Tool
from worker import runtime
from worker.keys import Keys
from worker.run import EndReason, Run, RunStatus
from worker.runtime import Runtime
from worker.service import approvals, connections, grants, runs
from worker.surface import TellLater

log = structlog.get_logger(__name__)
CARD_RECORD_PAUSES = (0.5, 1.0, 2.0, 4.0)  # seconds between tries to record a posted card

P = ParamSpec("P")

UPDATE_INTERVAL = 1.2  # seconds between chat.update calls for one run (Tier 3: 50+/min)
STATUS_REFRESH = 90.0  # Slack clears an assistant status after 2 minutes


def with_rate_limit_retries(client: WebClient) -> WebClient:
    """Retry 429s after Slack's Retry-After, and 500/503s after a backoff (0.25 s, doubling
    with the attempt; both opt-in in slack_sdk). Without the second, one 5xx from Slack lost
    what the call carried for good: a card never updated with its decision, an answer never
    posted, an edit modal never opened (found by the chaos soak, tests/support/chaos.py).
    The handlers share one attempt count per call, so a call retried twice for 429s has two
    5xx retries left: 4 covers a rate limit and an outage in a row."""
    if not any(isinstance(h, RateLimitErrorRetryHandler) for h in client.retry_handlers):
        client.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=2))
    if not any(isinstance(h, ServerErrorRetryHandler) for h in client.retry_handlers):
        backoff = BackoffRetryIntervalCalculator(backoff_factor=0.25)
        client.retry_handlers.append(
            ServerErrorRetryHandler(max_retry_count=4, interval_calculator=backoff)
        )
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
        self.keys = Keys(rt.settings.namespace)  # the per-person reminder caps and digests
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
                found = runs.find(self.rt, run_id)
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

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        if self.gone(run):
            return
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if channel:
            card = self.card(request, tool.description)
            self._post_card(run, request, channel, thread_ts, card)
        elsewhere = approvals.approvals_channel(self.rt)
        if elsewhere and elsewhere != channel:
            note = m.CARD_FROM_THREAD.format(channel=channel_link(channel)) if channel else None
            card = self.card(request, tool.description, note)
            self._post_card(run, request, elsewhere, None, card)

    def approvals_requested(self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]) -> None:
        """One turn's writes on one card (bot.render.batch_card), ITEMS_PER_CARD at most a
        card."""
        if self.gone(run):
            return
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        elsewhere = approvals.approvals_channel(self.rt)
        for start in range(0, len(requests), ITEMS_PER_CARD):
            group = [request for request, _ in requests[start : start + ITEMS_PER_CARD]]
            batch_id = approvals.create_batch(self.rt, group)
            if channel:
                card = self.batch(batch_id, group)
                self._post_card(run, group, channel, thread_ts, card, batch_id)
            if elsewhere and elsewhere != channel:
                note = m.CARD_FROM_THREAD.format(channel=channel_link(channel)) if channel else None
                card = self.batch(batch_id, group, note)
                self._post_card(run, group, elsewhere, None, card, batch_id)

    def batch(
        self, batch_id: str, requests: list[ApprovalRequest], elsewhere: str | None = None
    ) -> Message:
        facts = {r.tool: approvals.facts(self.rt, r) for r in requests}
        return batch_card(
            batch_id,
            requests,
            approvers=self.approvers(requests[0]),
            high_risk={tool for tool, f in facts.items() if f.high_risk},
            descriptions={tool: f.tool.description for tool, f in facts.items() if f.tool},
            elsewhere=elsewhere,
        )

    def _post_card(
        self,
        run: Run,
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
        late = [each.id for each in requests if not self._record_card(each.id, where)]
        for approval_id in late:  # decided while the card was posted: its outcome, at once
            decided = approvals.find(self.rt, approval_id)
            if decided is not None:
                self.approval_resolved(run, decided)

    def _record_card(self, approval_id: str, where: dict[str, str]) -> bool:
        """Record a card that is posted: `add_card`, asked again for a few seconds while
        Redis does not answer (a restart, a failover). Unrecorded, the decision was never
        drawn on it, and it offered its buttons for good (found by the chaos soak, seed 62:
        the connection closed by a restart as the card was recorded)."""
        for pause in CARD_RECORD_PAUSES:
            try:
                return approvals.add_card(self.rt, approval_id, where)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("card_record_retry", approval_id=approval_id, error=str(exc)[:200])
                time.sleep(pause)
        return approvals.add_card(self.rt, approval_id, where)

    def card(
        self,
        request: ApprovalRequest,
        description: str | None = None,
        elsewhere: str | None = None,
        outcome: str | None = None,
    ) -> Message:
        facts = approvals.facts(self.rt, request)
        return approval_card(
            request,
            description=facts.description if description is None else description,
            approvers=self.approvers(request, facts),
            high_risk=facts.high_risk,
            elsewhere=elsewhere,
            outcome=outcome,
            offers=grant_buttons(request, facts.grants),
            acts_as=self.acts_as(facts.tool),
        )

    def acts_as(self, tool: Tool | None) -> str | None:
        """A per-user tool's provider, for the card's "acts as @alice's GitHub"."""
        if tool is None or not tool.connection:
            return None
        return connections.label(self.rt, tool.connection)

    def approvers(self, request: ApprovalRequest, facts: approvals.Facts | None = None) -> str:
        """Who may decide, in words; an escalated request names its escalation roles too."""
        facts = facts or approvals.facts(self.rt, request)
        if not facts.escalated_to:
            return facts.approvers
        roles = ", ".join("@" + r for r in facts.escalated_to)
        return facts.approvers + m.CARD_ESCALATED.format(roles=roles)

    def approvals_covered(self, run: Run, requests: list[ApprovalRequest]) -> None:
        """One compact note in the thread for the turn's writes standing grants approved."""
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if not channel or not thread_ts or self.gone(run):
            return
        used = grants.used_in(self.rt, [r.grant_id for r in requests])
        note = covered_message(requests, {g.id: g for g in used})
        self.client.chat_postMessage(
            channel=channel, thread_ts=thread_ts, text=note.text, blocks=note.blocks
        )

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        if self.gone(run):  # nothing of it can be redrawn in that workspace
            approvals.card_shown(self.rt, request.id)
            return
        reason = run.reason  # not set yet when the loop withdraws a cancelled run's requests
        if reason is None and runs.cancelled_by(self.rt, run.id):
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
        `also` is the card that was clicked, in case it was not recorded yet. A decided
        request's cards are owed its outcome until they all show it (or cannot be shown,
        e.g. deleted): one that Slack could not take now is left to the sweeper's next pass."""
        outcome = outcome_text(request, run_reason) if request.decided else None
        later = False
        cards = list(request.cards)
        known = {(c.get("channel"), c.get("ts")) for c in cards}
        if also and also.get("channel") and (also["channel"], also.get("ts")) not in known:
            cards.append(also)
        for card in cards:
            note = None
            if card["channel"] != request.channel_id and request.channel_id:
                note = m.CARD_FROM_THREAD.format(channel=channel_link(request.channel_id))
            batch = approvals.batch(self.rt, card["batch"]) if card.get("batch") else []
            if batch:  # the batch card again, every item as it stands now
                message = self.batch(card["batch"], batch, note)
            else:
                message = self.card(request, elsewhere=note, outcome=outcome)
            try:
                self.client.chat_update(
                    channel=card["channel"], ts=card["ts"], text=message.text, blocks=message.blocks
                )
            except (
                SLACK_ERRORS
            ) as error:  # each card on its own: a deleted one must not stop the rest
                later = later or passing(error)
                log.exception("approval_card_update_failed", approval_id=request.id, **card)
        if request.decided and not later:
            approvals.card_shown(self.rt, request.id, drawn=len(request.cards))

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        """DM the people who may decide the requests of one card, with a link to it: one DM
        per person, at most one a minute per person (bot.outbound.reminder_dms)."""
        if self.gone(run):
            return
        if self._groups is None:
            self._groups = user_groups(self.rt, self.client)
        kind = "escalated" if escalated else "reminded"
        reminders.remind(
            self.client,
            lambda request: approvals.deciders(self.rt, request, escalated=escalated),
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
        job that DMs them together when the interval is over (`send_digest`, below)."""
        keys = self.keys
        held = keys.person(person, kind + ":held")
        if self.rt.redis.scard(held) < reminders.DIGEST_HELD:
            pipe = self.rt.redis.pipeline(transaction=False)
            pipe.sadd(held, *[r.id for r in requests])
            pipe.expire(held, int(self.rt.settings.approval_ttl))
            pipe.execute()
        due = keys.person(person, kind + ":digest")
        if self.rt.redis.set(due, "1", nx=True, ex=reminders.REMINDER_INTERVAL):
            self.rt.queue.enqueue_in(
                timedelta(seconds=reminders.REMINDER_INTERVAL),
                "bot.outbound.slack_surface.send_digest",
                person,
                kind,
                job_id=f"digest-{kind}-{person}",
            )

    def digest(self, person: str, kind: str) -> str:
        """DM `person` the calls held back from them that still wait for them to decide."""
        held = self.keys.person(person, kind + ":held")
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.smembers(held)
        pipe.delete(held)
        ids = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()[0])
        if self._groups is None:
            self._groups = user_groups(self.rt, self.client)
        escalated = kind == "escalated"
        waiting = [
            r
            for r in (approvals.find(self.rt, i) for i in ids)
            if r is not None
            and not r.decided
            and not self.installations.revoked(r.team_id)
            and person
            in reminders.recipients(
                approvals.deciders(self.rt, r, escalated=escalated), self._groups, r.requester
            )
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
        key = self.keys.person(person, kind)
        return bool(self.rt.redis.set(key, "1", nx=True, ex=reminders.REMINDER_INTERVAL))

    # -- the answer as it is written (bot/outbound/answers.py) -----------------------------

    def answer_stream(self, run: Run) -> StreamedAnswer | None:
        """Where the model's answer text goes while it writes it (`worker.streaming`)."""
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if not channel or not thread_ts or self.gone(run):
            return None
        return self.answers.open(run, channel, thread_ts)

    # -- the end --------------------------------------------------------------------------------

    def finished(self, run: Run) -> None:
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        self._stop_status(run.id)
        sending = self.throttle.close(run.id)
        streamed = self.answers.take(run.id)
        if not channel or not thread_ts or self.gone(run):
            return
        cancelled_by = None
        if run.reason == EndReason.CANCELLED:
            cancelled_by = runs.cancelled_by(self.rt, run.id)
        with sending or contextlib.nullcontext():
            self._final_status(run, channel, thread_ts, cancelled_by)
        messages = flag_ungrounded(answer_messages(run, cancelled_by), run)
        posted = 0
        try:
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
                posted += 1
        except SLACK_ERRORS as error:
            # Slack limiting us past the client's retries, down, or out of reach: the answer
            # is posted later, not lost. Only while none of its messages is posted: posted
            # again whole, those Slack took would show twice, at every try (found by review)
            if passing(error) and not posted:
                raise TellLater(f"the answer could not be posted for now: {error}") from error
            raise

    def connect_needed(
        self, run: Run, provider: str, label: str, more_access: tuple[str, ...] = ()
    ) -> None:
        """Offer the requester (only them: ephemeral) a Connect button in the run's thread; the
        flow it starts is bound to them (and asks for `more_access` too)."""
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if not channel or self.gone(run):
            return
        team, user = run.requester.team_id, run.requester.user_id
        try:
            url = connections.connect_url(self.rt, team, user, provider)
        except connections.ConnectRefused as refused:
            text = m.CONNECT_UNAVAILABLE.format(label=label, why=str(refused))
            self.client.chat_postEphemeral(channel=channel, user=user, text=text)
            return
        prompt = connect_prompt(label, url, provider, more_access)
        self.client.chat_postEphemeral(
            channel=channel,
            user=user,
            thread_ts=thread_ts or None,
            text=prompt.text,
            blocks=prompt.blocks,
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


PASSING_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable"})


def passing(error: Exception) -> bool:
    """Would the same call succeed later? Slack being down, slow or limiting us: yes; Slack
    refusing it (the message was deleted, the channel archived, a token revoked): no."""
    if not isinstance(error, SlackApiError):
        # the network, a timeout, a reply cut short; not the SDK refusing the call (a request
        # it cannot make)
        return isinstance(error, (OSError, http.client.HTTPException))
    status = error.response.status_code
    return status == 429 or status >= 500 or error.response.get("error") in PASSING_ERRORS


def send_digest(person: str, kind: str) -> str:
    """The RQ job, at the end of a person's interval: DM what was held back from them."""
    surface = runtime.current().surfaces.get("slack")
    if not isinstance(surface, SlackSurface):
        return "no slack surface"
    return surface.digest(person, kind)
