"""Asking: a person's question becomes a run, continuing their own conversation in a thread."""

from __future__ import annotations

import functools
from typing import Any

import redis
import structlog

from tools.execute import valid_unicode
from worker import profiles, tracing
from worker.events import EventKind
from worker.limits import LimitExceeded
from worker.run import Requester, Run, new_run_id
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

MAX_QUESTION_CHARS = 4000
MAX_HISTORY_MESSAGES = 20
MAX_HISTORY_CHARS = 16_000  # a reply carries at most this much of the thread: bounded storage
MAX_THREAD_HOPS = 20  # how far back a reply looks for the asker's own last run in the thread


class QuestionRejected(ValueError):
    pass


class QuestionNotStarted(RuntimeError):
    """Redis failed before the run existed: nothing was started, and the person who asked
    must be told to ask again (the surface has already acknowledged the question). The cause
    is the Redis error."""


def submit(
    rt: Runtime,
    question: str,
    requester: Requester,
    *,
    origin: dict[str, str] | None = None,
    parent: Run | None = None,
    profile: str | None = None,
    whole_transcript: bool = False,
) -> Run:
    """Create a run and queue it. `parent` continues that run's conversation (a thread reply).
    The run gets the profile of the requester's channel, or the one named by `profile`.
    `whole_transcript`: carry the parent's transcript as it is, its tool calls and results
    too (the requester's own run going on: worker/service/resuming.py)."""
    if whole_transcript and (parent is None or parent.requester.user_id != requester.user_id):
        raise ValueError("only the requester's own run can be continued with its transcript")
    text = valid_unicode(question).strip()
    if not text:
        raise QuestionRejected("The question is empty.")
    if len(text) > MAX_QUESTION_CHARS:
        raise QuestionRejected(
            f"The question is {len(text)} characters long; the limit is {MAX_QUESTION_CHARS}."
        )
    try:
        run, admitted, queued = _create(
            rt, text, requester, origin, parent, profile, whole_transcript
        )
    except redis.RedisError as exc:
        raise QuestionNotStarted(type(exc).__name__) from exc
    try:
        _start(rt, run, admitted, queued)
    except redis.RedisError as exc:  # created due, or in the person's line: not lost
        log.warning("run_enqueue_failed", run_id=run.id, error=type(exc).__name__)
    return run


def _create(
    rt: Runtime,
    text: str,
    requester: Requester,
    origin: dict[str, str] | None,
    parent: Run | None,
    profile: str | None,
    whole_transcript: bool,
) -> tuple[Run, bool, bool]:
    """The run, stored with its first event; whether it was admitted (else it waits in the
    person's line); and whether it was queued with it, in its transaction. When storing it
    fails (Redis, or the job before anything was sent) and the run is not there, its place in
    flight or in line is given back (when Redis still answers) and the error raised."""
    try:
        rt.limits.check(requester.user_id)
    except LimitExceeded as exc:
        log.info("question_limited", user=requester.user_id, why=str(exc))
        raise QuestionRejected(str(exc)) from exc
    history: list[dict[str, Any]] = []
    if parent is not None and whole_transcript:
        history = [dict(message) for message in parent.messages]
    elif parent is not None:
        history = [*conversation(rt, parent, requester.user_id)]
    agent = (
        profiles.named(rt.policy, profile)
        if profile is not None
        else rt.policy.profile_for(requester.channel_id)
    )
    run = Run(
        id=new_run_id(),
        question=text,
        requester=requester,
        model=rt.model.model if rt.model else "",
        messages=[*history, {"role": "user", "content": text}],
        budgets=rt.settings.budgets.model_copy(),
        origin=dict(origin or {}),
        parent_id=parent.id if parent else None,
        policy_version=rt.policy.version,
    )
    profiles.start(rt, run, agent)
    run.trace = tracing.new_run(len(text), run.profile.name if run.profile else None)
    created = rt.events.encode(
        EventKind.RUN_CREATED,
        user=requester.user_id,
        channel=requester.channel_id,
        roles=requester.roles,
        question=text,
        parent=run.parent_id,
        profile=run.profile.name if run.profile else None,
    )
    # Admitted first: the run is then created due (the sweeper queues it if its job is lost)
    # and queued, or, waiting in line, neither; created with its first event and its job in
    # one transaction, one round trip.
    admitted = False
    try:
        admitted = rt.limits.admit(requester.user_id, run.id)
        queue = functools.partial(rt.queue_advance, run.id) if admitted else None
        rt.store.create(run, wake=admitted, events=[created], then=queue)
    except Exception:  # Redis's error, or the job's (RQ's) before anything was sent
        if _stored(rt, run, admitted):  # the reply was lost, not the run: queued again, as a
            return run, admitted, False  # command of the transaction may have failed
        try:  # its place in flight or in line, which would count until stale (the job timeout)
            rt.limits.release(requester.user_id, run.id, rt.store.keys.due)
        except redis.RedisError as exc:
            log.warning("run_admission_kept", run_id=run.id, error=type(exc).__name__)
        raise
    return run, admitted, admitted


def _stored(rt: Runtime, run: Run, admitted: bool) -> bool:
    """Whether a run whose creation failed on Redis is there all the same: the transaction ran
    and its reply was lost, or a command in it failed (Redis does not roll the others back).
    Then it is made due, if admitted, so the sweeper queues it should the enqueue that follows
    be lost too. False when Redis cannot say."""
    try:
        if rt.store.find(run.id) is None:
            return False
    except redis.RedisError:
        return False
    log.warning("run_created_despite_error", run_id=run.id)
    if admitted:
        try:
            rt.store.wake(run.id)
        except redis.RedisError as exc:  # the enqueue that follows may still queue it
            log.warning("run_not_due", run_id=run.id, error=type(exc).__name__)
    return True


def _start(rt: Runtime, run: Run, admitted: bool, queued: bool) -> None:
    """Queue a stored run admitted but not queued yet, or say it waits in its person's
    line."""
    if admitted:
        if not queued:
            rt.enqueue_advance(run.id)
    else:
        ahead = rt.settings.limits.runs_in_flight
        rt.events.append(run.id, EventKind.WAITING_IN_LINE, in_flight=ahead)
        rt.surface(run).progress(
            run,
            f"Waiting: you have {ahead} questions in progress; this one starts when one of "
            "them is done",
        )


def unavailable_note(rt: Runtime) -> str | None:
    """One line for people about the tools the policy leaves out for lack of a rule."""
    return rt.policy.disabled_summary()


def conversation(rt: Runtime, parent: Run, asker: str) -> list[dict[str, str]]:
    """The asker's own questions and the answers they got earlier in this thread, without
    the tool chatter. Other people's messages in the thread are left out: they would reach
    the model as the asker's own words and could steer a run that has the asker's
    permissions. Each run's history is built this way, so it holds one person's turns."""
    run: Run | None = parent
    for _ in range(MAX_THREAD_HOPS):
        if run is None or run.requester.user_id == asker:
            break
        run = rt.store.find(run.parent_id) if run.parent_id else None
    if run is None or run.requester.user_id != asker:
        return []
    turns = [
        {"role": m["role"], "content": m["content"]}
        for m in run.messages
        if m.get("role") in ("user", "assistant") and not m.get("tool_calls") and m.get("content")
    ]
    kept: list[dict[str, str]] = []
    size = 0
    for turn in reversed(turns[-MAX_HISTORY_MESSAGES:]):  # the newest turns matter most
        size += len(turn["content"])
        if size > MAX_HISTORY_CHARS:
            break
        kept.append(turn)
    return kept[::-1]
