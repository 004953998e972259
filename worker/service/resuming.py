"""Going on after a person connects: a run that ended because a per-user tool found them not
connected continues once they have connected (called by `connections.confirm`).

The run that waited has ended: the model saw "not connected" and answered. It is not
re-opened (its events, approvals and ledger stay as they were). Instead it is continued in
the same conversation, as if the person had replied "I have connected my People account —
please go on.": a new run, the parent's child, in the same thread (the parent's origin),
carrying the parent's whole transcript, its tool calls and results too, so the model knows
what it tried and why it stopped. It calls the tool again, and this time the tool acts as
the person. The surface shows it as it shows any run, in the thread.

Which runs go on: the person's own (same team: a Slack user id is only unique in its
workspace), that ended with an answer less than RESUME_SECONDS ago (a Connect prompt's flow
lives FLOW_SECONDS, its finishing code PENDING_SECONDS), after a `connection_needed` for
this provider, and that none of their later runs continues yet (they went on without it:
a continuation now would fork their conversation). Only the person's own newest runs are
read (they are read anyway), so this answers within the 3 seconds a Slack modal
submission has; a reply by someone else in the thread does not stop it. The continuation
is asked with the roles recorded for the parent, as a run that waited for an approval is.

Exactly once: a marker per run, taken with SET NX before the continuation is submitted, so
two confirms (a second connection, a retried submission, two processes at once) resume a
run once. A continuation refused by the person's limits gives its marker back: a later
confirm may try again.
"""

from __future__ import annotations

import contextlib
import time

import redis
import structlog

from worker.connections.store import FLOW_SECONDS, PENDING_SECONDS
from worker.events import EventKind
from worker.run import Run, RunStatus
from worker.runtime import Runtime
from worker.service.asking import QuestionNotStarted, QuestionRejected, submit

log = structlog.get_logger(__name__)

RESUME_SECONDS = FLOW_SECONDS + PENDING_SECONDS  # a run ended longer ago than this stays ended
RECENT_RUNS = 20  # the person's newest runs looked at
MAX_RESUMED = 3  # continuations one confirm starts, at most
MARKER_SECONDS = 86_400  # longer than RESUME_SECONDS: a marker outlives the chance to resume
GO_ON = "I have connected my {label} account — please go on."


def resume_waiting(rt: Runtime, team: str, user: str, provider: str, label: str) -> list[Run]:
    """Continue `user`'s runs that ended waiting for their `provider` connection; the
    continuations started (newest first)."""
    theirs = [
        r for r in rt.store.recent(user_id=user, limit=RECENT_RUNS) if r.requester.user_id == user
    ]
    continued = {run.parent_id for run in theirs}
    started: list[Run] = []
    for run in waiting_for(rt, theirs, team, provider, time.time()):
        if len(started) >= MAX_RESUMED:
            break
        if run.id in continued:
            continue
        marker = rt.store.keys.resumed(run.id)
        if not rt.redis.set(marker, "1", nx=True, ex=MARKER_SECONDS):
            continue  # resumed already (another confirm)
        try:
            child = submit(
                rt,
                GO_ON.format(label=label),
                run.requester,
                origin=continued_origin(run),
                parent=run,
                whole_transcript=True,
            )
        except (QuestionRejected, QuestionNotStarted) as refused:
            with contextlib.suppress(redis.RedisError):  # else it is not resumed for a day
                rt.redis.delete(marker)
            log.info("run_not_resumed", run_id=run.id, why=str(refused))
            continue
        log.info("run_resumed", run_id=run.id, continuation=child.id, provider=provider)
        started.append(child)
    return started


def waiting_for(rt: Runtime, theirs: list[Run], team: str, provider: str, now: float) -> list[Run]:
    """Of the person's runs (`theirs`, newest first), those of `team` that ended with an
    answer after finding them not connected to `provider`, within RESUME_SECONDS."""
    found = []
    for run in theirs:
        if (
            run.status == RunStatus.COMPLETED
            and run.requester.team_id == team
            and run.ended_at is not None
            and now - run.ended_at <= RESUME_SECONDS
            and needed(rt, run, provider)
        ):
            found.append(run)
    return found


def needed(rt: Runtime, run: Run, provider: str) -> bool:
    return any(
        e.kind == EventKind.CONNECTION_NEEDED and e.data.get("provider") == provider
        for e in rt.events.read(run.id)
    )


def continued_origin(run: Run) -> dict[str, str]:
    """Where the parent was asked (its surface, channel, thread), without what a surface
    wrote about the parent itself (its status message) or the event that asked it."""
    return {k: v for k, v in run.origin.items() if k not in ("status_ts", "event_id")}
