"""Running tools for a run: reads at once (concurrently), writes only after a decision, once."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
import structlog

from approvals import ApprovalRequest, ApprovalStatus, LedgerState
from approvals.edits import changes, changes_text
from tools.context import ToolContext
from tools.decode import canonical_json
from tools.exceptions import ArgumentError, NotConnected
from tools.execute import Observation, execute
from tools.registry import Tool
from tools.threads import InThread
from worker import metrics, tracing
from worker.events import EventKind
from worker.run import Call, Run
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def context_for(
    rt: Runtime, run: Run, call: Call, idempotency_key: str | None = None, tool: Tool | None = None
) -> ToolContext:
    """Identity comes from the run's verified requester, never from the model's arguments.
    The deadline is what is left of the run's working time (as of its last saved step). A
    per-user tool's credentials are the requester's own connection: a write approved by
    someone else still acts as the person who asked."""
    left = run.budgets.deadline_seconds - run.usage.active_seconds
    credentials = refused = None
    if tool is not None and tool.connection:
        credentials, refused = _requester_token(rt, run, tool.connection)
    return ToolContext(
        user_id=run.requester.user_id,
        team_id=run.requester.team_id,
        channel_id=run.requester.channel_id,
        roles=frozenset(run.requester.roles),
        run_id=run.id,
        call_id=call.id,
        idempotency_key=idempotency_key,
        deadline=time.monotonic() + left,
        settings=rt.settings.tool_settings,
        credentials=credentials,
        refused=refused,
    )


def _requester_token(
    rt: Runtime, run: Run, provider: str
) -> tuple[Callable[[], str], Callable[[str, bool], str]]:
    team, user = run.requester.team_id, run.requester.user_id

    def token() -> str:
        if rt.connections is None:
            raise NotConnected(provider, provider, "connections are not set up here")
        return rt.connections.token_for(team, user, provider)

    def refused(token: str, refresh: bool) -> str:
        if rt.connections is None:
            raise NotConnected(provider, provider, "connections are not set up here")
        return rt.connections.refused(team, user, provider, token, refresh=refresh)

    return token, refused


def offer_connection(rt: Runtime, run: Run, call: Call, observation: Observation) -> None:
    """A per-user tool found the person not connected (or connected without the access the
    call needs): record it, and offer them Connect."""
    if not observation.needs_connection:
        return
    provider, more = observation.needs_connection, observation.more_access
    label = rt.connections.label(provider) if rt.connections is not None else provider
    extra = {"more_access": list(more)} if more else {}
    rt.events.append(
        run.id,
        EventKind.CONNECTION_NEEDED,
        call_id=call.id,
        tool=call.name,
        provider=provider,
        **extra,
    )
    if more and rt.connections is not None:  # the next Connect asks for them too
        try:
            rt.connections.store.want(run.requester.team_id, run.requester.user_id, provider, more)
        except redis.RedisError:  # the offer still goes out, asking for what it can
            log.warning("connection_want_not_kept", run_id=run.id, provider=provider)
    rt.surface(run).connect_needed(run, provider, label, more)


def run_reads(rt: Runtime, run: Run, calls: list[Call]) -> None:
    """Run the turn's read calls concurrently; each has its own timeout and output cap. The
    first is waited for in this thread, each other one in a thread of its own (every call's
    handler runs in a thread of its own: tools/execute.py). Most turns ask for one call,
    which then costs no thread hand-over; a process keeps no pool of threads that would
    only grow with the largest turn it has seen: one kept thread per slot at most
    (tools/threads.py), the others end with their call."""
    if not calls:
        return
    names = ", ".join(sorted({c.name for c in calls}))
    rt.surface(run).progress(run, f"Running {names}")
    pending: list[Callable[[], Observation]] = []
    for n, call in enumerate(calls):
        tool = rt.registry.get(call.name)
        assert tool is not None and call.args is not None
        ctx = context_for(rt, run, call, tool=tool)
        work = functools.partial(tracing.tool_call, call, execute, tool, ctx, call.args)
        pending.append(work if n == 0 else _started(work, rt.read_threads))  # 1st: below
    for call, outcome in zip(calls, pending, strict=True):
        observation: Observation = outcome()
        call.state, call.result = "done", observation.text
        run.record_outcome(call.id, observation.ok)
        record_result(rt, run, call, observation)
        offer_connection(rt, run, call, observation)


def _started(
    work: Callable[[], Observation], places: threading.BoundedSemaphore
) -> Callable[[], Observation]:
    """`work` started in a thread of its own (`InThread`: with this thread's context, the
    run's log context and the step's span) once one of `places` is free; returns what
    waits for its observation. `work` ends within its tool's timeout, so the wait does too,
    and so does the wait for a place: every place is held by such a thread."""
    places.acquire()
    try:
        running = InThread(work, "tool-call", on_end=places.release)
    except BaseException:  # no thread to give the place back
        places.release()
        raise

    def wait() -> Observation:
        running.done.wait()
        return running.result()

    return wait


def run_decided(rt: Runtime, run: Run, call: Call, request: ApprovalRequest) -> str:
    """The observation for a decided write: run it once if approved, else say why not (a call
    that is not run records no outcome)."""
    if request.status == ApprovalStatus.REJECTED:
        why = f": {request.reason}" if request.reason else " (no reason given)"
        told = ""
        if request.instructions:  # the approver's words: feedback, never a grant
            told = (
                f"\nFeedback from the approver <@{request.decided_by}>, a person reviewing "
                "this call (their words are a suggestion for what to do instead; they do "
                f"not change what you may do): {request.instructions}"
            )
        return f"Not run: <@{request.decided_by}> rejected this call{why}.{told}"
    if request.status == ApprovalStatus.EXPIRED:
        return "Not run: nobody approved this call before the request expired."
    if request.status == ApprovalStatus.WITHDRAWN:
        return f"Not run: the request was withdrawn ({request.reason})."
    tool = rt.registry.get(call.name)
    if tool is None:
        return f"Not run: the tool {call.name} is no longer available."
    assert call.args is not None
    edited = ""
    if request.original_args is not None:  # approved with edits: the edited call, never the
        if canonical_json(request.original_args) != canonical_json(call.args):  # original
            return "Not run: the approval was for another call."
        try:
            call.args = tool.validate(request.args)
        except ArgumentError as exc:
            return f"Not run: the edited arguments are invalid: {exc.message}"
        found = changes(request.original_args, call.args)
        edited = (
            f"Approved with edits by <@{request.decided_by}>: it ran with these changes to "
            f"your arguments:\n{changes_text(found)}\nResult: "
        )
    if not request.covers(call.name, call.args, run.requester.user_id):
        return "Not run: the approval does not cover these exact arguments."
    denial = rt.policy.authorize(call.name, frozenset(run.requester.roles), call.args)
    if denial is not None:  # the policy changed while the request waited
        return f"Not run: {denial.reason}"
    return edited + execute_once(rt, run, call, tool, request)


def execute_once(rt: Runtime, run: Run, call: Call, tool: Tool, request: ApprovalRequest) -> str:
    assert call.args is not None
    ctx = context_for(rt, run, call, idempotency_key=request.id, tool=tool)
    entry = rt.ledger.begin(request.id, request.binding)
    tracing.ledger("begin", request.id, state=entry.state.value)
    if entry.state == LedgerState.FINISHED:
        run.record_outcome(call.id, entry.ok)
        return str(entry.result)
    if entry.state == LedgerState.STARTED:
        return reconcile(rt, run, call, tool, request)
    rt.events.append(
        run.id,
        EventKind.WRITE_STARTED,
        approval_id=request.id,
        call_id=call.id,
        tool=call.name,
        pid=os.getpid(),
    )
    rt.events.flush(run.id)  # on record before the write starts, whatever happens next
    rt.surface(run).progress(run, f"Running {call.name} (approved)")
    observation = tracing.tool_call(call, execute, tool, ctx, call.args)
    rt.ledger.finish(request.id, observation.ok, observation.text)
    tracing.ledger("finish", request.id, ok=observation.ok)
    run.record_outcome(call.id, observation.ok)
    record_result(rt, run, call, observation, approval_id=request.id)
    offer_connection(rt, run, call, observation)
    return observation.text


def reconcile(rt: Runtime, run: Run, call: Call, tool: Tool, request: ApprovalRequest) -> str:
    """A worker stopped while this write ran. Ask the tool what happened; never run it again."""
    assert call.args is not None
    ctx = context_for(rt, run, call, idempotency_key=request.id, tool=tool)
    found = None
    if tool.reconcile is not None:
        try:
            found = tool.reconcile(ctx, call.args)
        except Exception:  # a tool's own hook: any failure means "unknown"
            log.exception("reconcile_failed", run_id=run.id, tool=tool.name)
    if found is not None:
        text = found if isinstance(found, str) else canonical_json(found)
        run.record_outcome(call.id, True)
        rt.ledger.finish(request.id, True, text)
        rt.events.append(run.id, EventKind.WRITE_RECONCILED, approval_id=request.id, tool=call.name)
        return text
    when = datetime.fromtimestamp(request.decided_at, UTC).strftime("%H:%M UTC")
    note = (
        f"{call.name} (approved by <@{request.decided_by}> at {when}) was interrupted while it "
        "ran; its outcome is unknown and it was not retried."
    )
    run.notes.append(note)
    run.record_outcome(call.id, False)
    rt.ledger.finish(request.id, False, "Outcome unknown: " + note)
    rt.events.append(run.id, EventKind.WRITE_UNKNOWN, approval_id=request.id, tool=call.name)
    return "Outcome unknown: " + note


def record_result(
    rt: Runtime, run: Run, call: Call, observation: Observation, approval_id: str | None = None
) -> None:
    metrics.tool_called(call.name, call.effect, observation.ok)
    rt.events.append(
        run.id,
        EventKind.TOOL_RESULT,
        call_id=call.id,
        tool=call.name,
        args=call.args,
        ok=observation.ok,
        truncated=observation.truncated,
        result=observation.text[:4000],
        approval_id=approval_id,
    )
