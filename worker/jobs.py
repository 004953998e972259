"""RQ job functions, enqueued by dotted path with RQ's JSON serializer.

Never enqueued with RQ's `Retry`: a retried job starts from the top, and a write could run
twice. Crashed runs are recovered from their persisted state by the sweeper instead.
"""

from __future__ import annotations

import contextlib
import time

import redis
import structlog
from rq import get_current_job

from tools.exceptions import brief
from worker import runtime, tracing
from worker.audit import log_decision
from worker.events import EventKind
from worker.lease import Lease
from worker.loop import Finish, drive, end, say_ended
from worker.run import EndReason, Run, RunSchemaError, RunStatus
from worker.store import UNTOLD_SECONDS, LeaseLost, RunNotFound, Untold
from worker.surface import TellLater

log = structlog.get_logger(__name__)

# The outcome of a job whose process was stopping: the run went back to the queue.
HANDED_BACK = "handed_back"
# A run this release cannot read (a newer one wrote it): left, untouched, to another worker.
UNKNOWN_SCHEMA = "unknown_schema"
# Redis went away under the step: the run is as last saved, for the sweeper, as after a crash.
INTERRUPTED = "interrupted"
# A run ended that its surface could not say for now (Slack down): said again, later.
UNSAID = "unsaid"
# The outcomes of a job that leaves its run ended, and said to be (by it, or before it).
ENDED = frozenset(status.value for status in RunStatus if status.terminal)


def advance(run_id: str) -> str:
    """Advance a run as far as it can go now. Safe to call any number of times."""
    job = get_current_job()
    return advance_run(runtime.current(), run_id, job.id if job is not None else None)


def expire_approval(approval_id: str) -> str:
    """Scheduled at creation for the request's expiry time. Expired means denied."""
    return expire(runtime.current(), approval_id)


def advance_run(rt: runtime.Runtime, run_id: str, job_id: str | None = None) -> str:
    taken_job: str | None = job_id or ""  # its queued mark dropped with the first try
    while True:
        lease = rt.leases.acquire(run_id, taken_job=taken_job)
        taken_job = None
        if lease is None:
            rt.store.wake(run_id)  # the holder will see the new score and look again
            return "busy"
        due_seen = lease.due_seen
        structlog.contextvars.bind_contextvars(run_id=run_id)
        rt.events.hold(run_id)
        rt.limits.hold_charges(run_id)
        outcome = ""
        try:
            outcome = _advance_held(rt, run_id, lease)
            if outcome == HANDED_BACK:
                rt.store.wake(run_id)  # due again: if the re-queue below is lost, the sweeper
        finally:
            try:
                try:
                    rt.events.release(run_id)  # a hand-back's own event, at least, is left
                finally:
                    rt.limits.settle(run_id)  # a model call no save charged
            finally:  # let go whatever became of them: held, the lease was renewed for good
                # The run stays due for the sweeper when nothing came back (Redis failed
                # under the step and again under saving the failure: the run is as last
                # saved), and when it is handed back or left to a newer worker, whether or
                # not the wake that makes it due again went through: released as done, such
                # a run was left `running` with no lease and nothing to find it, for good
                # (found by the soak: a failover answered the hand-back's wake NOSCRIPT).
                settled = outcome not in ("", HANDED_BACK, UNKNOWN_SCHEMA, INTERRUPTED, UNSAID)
                again = lease.release(due_seen if settled else "", told=outcome in ENDED)
                structlog.contextvars.unbind_contextvars("run_id")
        if outcome == UNSAID:  # due in a while, behind runs whose worker died: the sweeper
            try:  # takes 200 a pass, oldest first (a rate limit's wait, an outage's blip)
                rt.store.due_in(run_id, _said_again_in(rt))
            except redis.RedisError as exc:  # due as it was: said again a little sooner
                log.warning("run_due_later_failed", run_id=run_id, error=brief(exc))
            return outcome
        if outcome == INTERRUPTED:  # not again at once: the sweeper, once Redis answers
            return outcome
        if outcome == HANDED_BACK:
            rt.enqueue_advance(run_id)
            return outcome
        if outcome == UNKNOWN_SCHEMA:  # due again, once the lease is gone: the sweeper
            rt.store.wake(run_id)  # queues it for another worker (a newer one reads it)
            return outcome
        if not again or outcome in ("missing", "lost"):
            return outcome


def _advance_held(rt: runtime.Runtime, run_id: str, lease: Lease) -> str:
    token = lease.token
    document, lease.document = lease.document, None  # read with the lease; not kept longer
    try:
        run = rt.store.load(run_id, document)
        del document
    except RunNotFound:
        log.warning("advance_missing_run", run_id=run_id)
        return "missing"
    except RunSchemaError as exc:  # a newer release wrote it (mixed fleet): leave it to one
        log.warning("advance_unknown_schema", run_id=run_id, error=str(exc))
        # passed over, not stopped under: the sweeper's re-queues until a newer worker takes
        # it do not count against the run (worker/loop.py: MAX_RECOVERIES)
        rt.store.forget_recoveries(run_id)
        return UNKNOWN_SCHEMA
    if run.status.terminal:
        return _say_late(rt, run, token)
    try:
        with tracing.advance(run):
            if not drive(rt, run, token):
                return HANDED_BACK
    except LeaseLost:
        log.warning("advance_lease_lost", run_id=run_id)
        return "lost"
    except TellLater as exc:  # saved as ended, marked as not yet said: said again, later
        return _unsaid(run_id, exc)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return _interrupted(run_id, exc)
    except Exception as exc:  # the job boundary: a run is never silently lost
        log.exception("advance_failed", run_id=run_id)
        try:
            end(rt, run, Finish(RunStatus.FAILED, EndReason.INTERNAL_ERROR, brief(exc)), token)
        except LeaseLost:
            return "lost"
        except TellLater as later:
            return _unsaid(run_id, later)
        except (redis.ConnectionError, redis.TimeoutError) as again:
            return _interrupted(run_id, again)
    return run.status.value


def _say_late(rt: runtime.Runtime, run: Run, token: str) -> str:
    """A run found ended: said now if it was saved as ended and never said (the worker that
    ended it stopped before it could, Redis lost the save's answer after it was done, or
    its surface could not say it then). The mark is held first, so one worker says it
    however many find the run; let go when this one cannot say it for now, and dropped
    once it is said. A worker killed while it says the run leaves the mark held: the next
    says it once the hold lapses."""
    try:
        untold = rt.store.claim_untold(run.id, token, _said_again_in(rt))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return _interrupted(run.id, exc)
    if untold is Untold.SAID:
        return run.status.value
    if untold is Untold.BEING_SAID:  # by a worker whose lease lapsed, or that was killed:
        log.info("run_being_said", run_id=run.id)  # due again once its hold lapses
        return UNSAID
    if run.ended_at is not None and time.time() - run.ended_at > UNTOLD_SECONDS:
        log.error("run_never_said", run_id=run.id, why="ended more than a day ago")
        return run.status.value
    log.warning("run_said_late", run_id=run.id, status=run.status.value)
    try:
        say_ended(rt, run)
    except (TellLater, redis.ConnectionError, redis.TimeoutError) as exc:
        with contextlib.suppress(redis.RedisError):  # else its hold lapses on its own
            rt.store.unhold_untold(run.id, token)
        if isinstance(exc, TellLater):
            return _unsaid(run.id, exc)
        return _interrupted(run.id, exc)
    try:
        rt.store.said(run.id, token)
    except redis.RedisError as exc:  # the release drops the mark as well; refused too, the
        # run is said again once the hold lapses: twice rather than never
        log.warning("run_said_mark_kept", run_id=run.id, error=brief(exc))
    return run.status.value


def _said_again_in(rt: runtime.Runtime) -> float:
    """How long after a run could not be said it is tried again, and how long a late teller
    holds it from when it took it (a fixed window, never renewed: past it, only the teller's
    lease keeps a second one off, so a say that outlasts both is said twice)."""
    return 2 * rt.settings.lease_seconds


def _interrupted(run_id: str, exc: Exception) -> str:
    """Redis restarting, loading its data or failing over under the job: as after a crash,
    the run goes on from its last save (a write started is reconciled through the ledger)
    and stays due for the sweeper. Ended as failed, a blip of Redis failed the person's run
    when the failure's own save went through (the chaos soak: LOADING under a save)."""
    log.warning("advance_interrupted", run_id=run_id, error=brief(exc))
    return INTERRUPTED


def _unsaid(run_id: str, exc: TellLater) -> str:
    """The run ended and its surface could not say so for now: it stays due, and the worker
    the sweeper gives it to two leases later says it (each try also has the Slack client's
    own retries), until a day after it ended."""
    log.warning("run_said_later", run_id=run_id, error=str(exc)[:300])
    return UNSAID


def expire(rt: runtime.Runtime, approval_id: str) -> str:
    request = rt.approvals.find(approval_id)
    if request is None:
        return "missing"
    decision = rt.approvals.expire(approval_id)
    if not decision.won:
        return decision.request.status.value
    rt.events.append(
        request.run_id, EventKind.APPROVAL_EXPIRED, approval_id=approval_id, tool=request.tool
    )
    log_decision(decision.request, "expiry")  # nobody decided in time: denied
    run = rt.store.find(request.run_id)
    tracing.approval_decided(decision.request, lambda: run.trace if run is not None else {})
    if run is not None:
        rt.surface(run).approval_resolved(run, decision.request)
    rt.enqueue_advance(request.run_id)
    return "expired"
