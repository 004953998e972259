"""The controller loop: one step at a time, state persisted after every step.

propose (model) -> decode -> validate -> authorize -> repeated? -> read: run now /
write: approval request and suspend -> observe -> decide. Each step returns one of three
small outcomes and `drive` dispatches on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import redis
import structlog

from approvals import ApprovalRequest, ApprovalStatus
from tools.decode import canonical_json, decode_arguments
from tools.exceptions import ArgumentError
from tools.registry import Tool
from worker import executor, grounding, metrics, profiles, reminders, standing, tracing
from worker.budgets import exhausted
from worker.events import EventKind
from worker.library import Demonstration
from worker.model_base import ModelError, ToolSpecs
from worker.model_watch import StepWatch
from worker.prompt import build_messages
from worker.roles import RolesUnavailable, recheck
from worker.run import Call, EndReason, Run, RunStatus
from worker.runtime import Runtime
from worker.turns import ModelTurn

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Continue:
    """More to do now."""


@dataclass(frozen=True)
class Suspend:
    """Waiting for people: the job ends and no worker is held."""


@dataclass(frozen=True)
class Finish:
    status: RunStatus
    reason: EndReason | None = None
    detail: str = ""


Step = Continue | Suspend | Finish


# How many times the sweeper may queue a run again (its worker died, or Redis failed, under it)
# with no step saved in between before a worker that finds it so ends it: a run that kills its
# worker every time (out of memory on what it reads), or whose step Redis keeps interrupting,
# is not taken up for good.
MAX_RECOVERIES = 10
RECOVERED_TOO_OFTEN = (
    "stopped: this question's work was taken up again {times} times after the worker doing "
    "it stopped (or lost Redis) under it; it is not tried again. An admin can find why in "
    "the workers' logs (run_recovered_too_often)."
)


class Clock:
    """Working time of a run across jobs; waiting for approvals is not counted."""

    def __init__(self, already: float) -> None:
        self.already = already
        self.started = time.monotonic()

    def total(self) -> float:
        return self.already + time.monotonic() - self.started


def drive(rt: Runtime, run: Run, lease_token: str) -> bool:
    """Advance `run` until it suspends or ends (True), or until this process is asked to stop
    (False: the run is saved as of its last step, for the caller to hand back to the queue).
    The caller holds the run's lease."""
    clock = Clock(run.usage.active_seconds)
    recovered = 0  # the times the sweeper queued it again since its last step was saved
    if run.status != RunStatus.RUNNING:
        run.status = RunStatus.RUNNING
        cancelled_by = rt.save(run, lease_token)
    else:  # another worker stopped under it (or handed it back): it goes on from its last save
        cancelled_by, recovered = rt.store.resumed_marks(run.id)
        if recovered > MAX_RECOVERIES and cancelled_by is None and not run.turn:
            # the same step taken up again and again (the count is dropped once a step is
            # saved past it): ended, so it is not repeated for good, its model call made
            # each time, unrecorded. Not with tool calls underway: their outcome (a write's,
            # reconciled through the ledger) is reported first.
            log.warning("run_recovered_too_often", run_id=run.id, recovered=recovered)
            detail = RECOVERED_TOO_OFTEN.format(times=recovered)
            end(rt, run, Finish(RunStatus.FAILED, EndReason.INTERNAL_ERROR, detail), lease_token)
            return True
    while True:
        if rt.stopping.is_set():
            rt.events.append(run.id, EventKind.HANDED_BACK, pid=os.getpid(), step=run.usage.steps)
            return False
        step = next_step(rt, run, clock, cancelled_by)
        run.usage.active_seconds = round(clock.total(), 3)
        match step:
            case Continue():
                cancelled_by = rt.save(run, lease_token)  # a cancel is learnt from the save
            case Suspend():
                run.status = RunStatus.AWAITING_APPROVAL
                rt.events.append(run.id, EventKind.SUSPENDED, approvals=run.pending_approvals)
                admit(rt, run, rt.save_releasing(run, lease_token))
            case Finish():
                end(rt, run, step, lease_token)
        if recovered:  # saved past where it stopped: the count was of a step now done
            rt.store.forget_recoveries(run.id)
            recovered = 0
        if not isinstance(step, Continue):
            return True


def next_step(rt: Runtime, run: Run, clock: Clock, cancelled_by: str | None) -> Step:
    if cancelled_by is not None:
        return Finish(RunStatus.PARTIAL, EndReason.CANCELLED, f"cancelled by <@{cancelled_by}>")
    note_policy(rt, run)
    unconfirmed = check_roles(rt, run)
    if unconfirmed is not None:
        return unconfirmed
    if run.turn:
        return resolve_turn(rt, run)
    spent = exhausted(run.budgets, run.usage, clock.total())
    if spent is not None:
        return Finish(RunStatus.PARTIAL, *spent)
    return call_model(rt, run, clock)


def note_policy(rt: Runtime, run: Run) -> None:
    """Record the policy this step is authorised under, and when it changed since the last
    step (the file was reloaded, worker/policy_watch.py): permissions follow the current one."""
    version = rt.policy.version
    if run.policy_version and run.policy_version != version:
        rt.events.append(run.id, EventKind.POLICY_CHANGED, before=run.policy_version, after=version)
    run.policy_version = version


def check_roles(rt: Runtime, run: Run) -> Finish | None:
    """Authorise this step with the requester's roles as they are now, not as they were
    when the run started; stop when they cannot be confirmed."""
    try:
        changed = recheck(rt.roles, run)
    except RolesUnavailable as exc:
        rt.events.append(run.id, EventKind.ROLES_UNAVAILABLE, error=str(exc)[:500])
        return Finish(
            RunStatus.PARTIAL,
            EndReason.ROLES_UNAVAILABLE,
            "stopped: Slack could not confirm the requester's user groups, so nothing more "
            "was run; ask again in a minute",
        )
    if changed is not None:
        before, after = changed
        rt.events.append(run.id, EventKind.ROLES_CHANGED, before=before, after=after)
    return None


def call_model(rt: Runtime, run: Run, clock: Clock) -> Step:
    model = rt.require_model(profiles.model_name(run))
    allowed = set(profiles.offered_tools(rt, run))
    demos, shown = select_demos(rt, run, allowed)
    specs = ToolSpecs(tool for tool in rt.registry if tool.name in allowed)
    remaining = run.budgets.deadline_seconds - clock.total()
    timeout = max(1.0, min(rt.settings.model_timeout, remaining))
    # the reply's bound: the profile's or the setting, within what the token budget has left
    left = run.budgets.max_tokens - run.usage.tokens  # at least 1: `exhausted` checked it
    max_tokens = max(1, min(profiles.max_tokens(rt, run), left))
    rt.surface(run).progress(
        run, f"Thinking (step {run.usage.steps + 1} of {run.budgets.max_steps})"
    )
    messages = build_messages(run, demos, demos_as_text=rt.settings.demos_as_text)
    watch = StepWatch(
        rt,
        run,
        step=run.usage.steps + 1,
        timeout=timeout,
        max_tokens=max_tokens,
        attempts=model.attempts,
    )
    over = watch.begin(shown)  # the person's day, all runs; the call on record as started
    if over is not None:
        return Finish(RunStatus.PARTIAL, EndReason.COST, "stopped: " + over)
    try:
        sink = rt.surface(run).answer_stream(run) if rt.settings.stream_answers else None
        asked = time.monotonic()
        turn = model.complete(messages, specs, timeout, sink, max_tokens=max_tokens, watch=watch)
        record_usage(rt, run, turn, watch)
        tracing.model_called(model, messages, turn)
    except ModelError as exc:
        run.usage.steps += 1  # a step was made; what its attempts cost is charged (watch)
        tracing.model_failed(model, exc.kind, time.monotonic() - asked)
        rt.events.append(run.id, EventKind.MODEL_ERROR, error=exc.detail, timeout=timeout)
        if exc.timed_out and timeout < rt.settings.model_timeout:
            return Finish(
                RunStatus.PARTIAL, EndReason.DEADLINE, "ran out of time waiting for the model"
            )
        return Finish(RunStatus.PARTIAL, EndReason.MODEL_ERROR, exc.detail)
    finally:
        watch.end()  # what it cost is spent as the call stops counting as in flight
    if turn.refusal:
        return Finish(
            RunStatus.PARTIAL, EndReason.REFUSED, f"the model refused: {turn.refusal[:500]}"
        )
    if turn.finish_reason == "length":
        return Finish(  # the reason says "cut off" already: the detail says where
            RunStatus.PARTIAL,
            EndReason.LENGTH,
            f"finish_reason length after {turn.completion_tokens} tokens; this step allowed "
            f"{max_tokens}",
        )
    if turn.finish_reason == "content_filter":
        return Finish(
            RunStatus.PARTIAL,
            EndReason.CONTENT_FILTER,
            "the model's reply was withheld by its filter",
        )
    if turn.calls:
        return plan_calls(rt, run, turn)
    if not (turn.content or "").strip():
        return Finish(RunStatus.PARTIAL, EndReason.MODEL_ERROR, "the model gave an empty answer")
    run.messages.append({"role": "assistant", "content": turn.content})
    run.answer = turn.content
    check_grounding(rt, run, specs)
    return Finish(RunStatus.COMPLETED)


def check_grounding(rt: Runtime, run: Run, specs: ToolSpecs) -> None:
    """Where tools were offered, the facts the answer states (figures, ids, names) must come
    from a tool result, from what the user wrote, or from the operator's text."""
    if not specs:
        return
    sources = [
        str(m.get("content") or "") for m in run.messages if m.get("role") in ("tool", "user")
    ]
    standing = [run.instructions, _readable(specs.text)]
    run.grounding = grounding.check(run.answer or "", sources, standing)
    run.ungrounded = run.grounding.facts
    if run.ungrounded:
        rt.events.append(
            run.id, EventKind.UNGROUNDED_FACTS, **run.grounding.model_dump(), verdict="ungrounded"
        )


@functools.lru_cache(maxsize=grounding.KEPT_SOURCES)
def _readable(offered: str) -> str:
    """The offered tools as the grounding check reads them (`json.dumps` of the request's
    entries, characters as written), from the request's text of them (`ToolSpecs`): once
    per set of tools, not at every run's end."""
    return json.dumps(json.loads(offered), ensure_ascii=False)


def select_demos(
    rt: Runtime, run: Run, allowed: set[str]
) -> tuple[list[Demonstration], tuple[str, list[str]]]:
    """Chosen once, at the run's first model call; later steps show the same ones. With the
    ones chosen now, the task library's usage counts (their key) and their ids: counted as
    shown by the script that starts the call (`StepWatch.begin`), in its round trip."""
    selector = profiles.demos_for(rt, run)
    if selector is None:
        return [], ("", [])
    if run.usage.steps == 0 and not run.demos:
        selection = selector.choose(run.question, allowed, record=False)
        run.demos = [d.id for d in selection.demos]
        rt.events.append(run.id, EventKind.DEMOS_SELECTED, demos=run.demos, **selection.record())
        return selection.demos, (selector.library.keys.demos_usage, run.demos)
    return selector.lookup(run.demos), ("", [])


def record_usage(rt: Runtime, run: Run, turn: ModelTurn, watch: StepWatch) -> None:
    usage = run.usage
    usage.steps += 1
    cost = watch.charge(turn.prompt_tokens, turn.completion_tokens)
    metrics.model_called(turn)
    rt.events.append(
        run.id,
        EventKind.MODEL_CALL,
        step=usage.steps,
        pid=os.getpid(),
        finish_reason=turn.finish_reason,
        prompt_tokens=turn.prompt_tokens,
        completion_tokens=turn.completion_tokens,
        cost=round(cost, 8),
        seconds=round(turn.seconds, 3),
        content=(turn.content or "")[:2000],
        calls=[
            {"id": c.id, "name": c.name, "arguments": c.arguments[:2000]}
            for c in turn.calls[: run.budgets.max_tool_calls + 1]  # one more: the run ends
        ],
        calls_proposed=len(turn.calls),
    )


def plan_calls(rt: Runtime, run: Run, turn: ModelTurn) -> Step:
    """Check every proposed call; run reads now; ask people about writes."""
    if run.usage.tool_calls + len(turn.calls) > run.budgets.max_tool_calls:
        run.usage.tool_calls += len(turn.calls)  # the calls' arguments are not kept: the
        return Finish(  # run ends, and the model_call event has the first 2,000 characters
            RunStatus.PARTIAL,
            EndReason.TOOL_CALLS,
            f"the model asked for {run.usage.tool_calls} tool calls "
            f"(limit {run.budgets.max_tool_calls})",
        )
    run.messages.append(
        {
            "role": "assistant",
            "content": turn.content,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in turn.calls
            ],
        }
    )
    run.usage.tool_calls += len(turn.calls)
    run.turn = [Call(id=c.id, name=c.name, arguments=c.arguments) for c in turn.calls]
    for position, call in enumerate(run.turn):
        repeated = check_call(rt, run, call, position)
        if repeated is not None:
            return repeated
    executor.run_reads(rt, run, [c for c in run.turn if c.effect == "read"])
    if all(c.state == "done" for c in run.turn):
        return resolve_turn(rt, run)  # nobody to ask: take the results now, one save not two
    return Continue()  # saved before any approval is asked for; resolve_turn asks


def check_call(rt: Runtime, run: Run, call: Call, position: int) -> Finish | None:
    """Decode, validate, authorize, detect repeats. Failures become the call's observation.

    An exact repeat with nothing written in between is answered with the earlier result
    once; asked for again, it ends the run. After a write runs, reading again is legitimate
    (the state may have changed), so what was seen is forgotten."""
    tool = rt.registry.get(call.name)
    roles = frozenset(run.requester.roles)
    offered = profiles.offered_tools(rt, run)
    if tool is None or call.name not in offered:
        if tool is None:
            text = f"Error: there is no tool named {call.name[:64]!r}."
        else:
            denial = profiles.authorize_caller(rt, run, call.name)
            text = f"Error: {denial.reason}" if denial else f"Error: you may not call {call.name}."
        allowed = ", ".join(offered) or "none"
        observe_denial(rt, run, call, f"{text} Tools you may call: {allowed}.")
        return None
    try:
        args = decode_arguments(tool, call.arguments)
    except ArgumentError as exc:
        call.state, call.result = "done", f"Error: invalid arguments for {call.name}: {exc}"
        rt.events.append(
            run.id, EventKind.TOOL_INVALID, call_id=call.id, tool=call.name, error=str(exc)
        )
        return None
    denial = rt.policy.authorize(call.name, roles, args)
    if denial is not None:
        observe_denial(rt, run, call, f"Error: {denial.reason}")
        return None
    fingerprint = hashlib.sha256(canonical_json([call.name, args]).encode()).hexdigest()[:16]
    earlier = run.seen.get(fingerprint)
    if earlier is not None:
        rt.events.append(
            run.id, EventKind.REPEATED_CALL, call_id=call.id, tool=call.name, args=args
        )
        if fingerprint in run.repeated:  # told once already: the model is going round
            return Finish(
                RunStatus.PARTIAL,
                EndReason.REPEATED_CALL,
                f"the model asked for {call.name} with the same arguments again",
            )
        run.repeated.append(fingerprint)
        call.state, call.result = "done", repeat_observation(run, call.name, *earlier)
        return None
    run.seen[fingerprint] = [run.usage.steps, position]
    call.args, call.effect = args, tool.effect
    return None


def repeat_observation(run: Run, tool: str, step: int, position: int) -> str:
    """What the model is told when it repeats a call: when it made it, and what it got."""
    calls = [m for m in run.messages if m.get("role") == "assistant" and m.get("tool_calls")]
    result = ""
    if 0 < step <= len(calls) and position < len(calls[step - 1]["tool_calls"]):
        call_id = calls[step - 1]["tool_calls"][position]["id"]
        after = run.messages[run.messages.index(calls[step - 1]) :]
        result = next(
            (str(m.get("content")) for m in after if m.get("tool_call_id") == call_id), ""
        )
    if step == run.usage.steps and not result:  # twice in this very turn
        return (
            f"Error: this turn asks for {tool} twice with the same arguments; it ran once "
            "(see the other result). The same call again ends this conversation."
        )
    return (
        f"Error: you already called {tool} with these arguments at step {step}, and nothing "
        f"has changed since. Its result was: {result[:1000]!r}. Use that result, or call "
        "with different arguments; the same call again ends this conversation."
    )


def observe_denial(rt: Runtime, run: Run, call: Call, text: str) -> None:
    call.state, call.result = "done", text
    rt.events.append(
        run.id,
        EventKind.TOOL_DENIED,
        call_id=call.id,
        tool=call.name,
        user=run.requester.user_id,
        why=text,
    )


def request_approval(
    rt: Runtime, run: Run, call: Call, position: int
) -> tuple[ApprovalRequest, Tool]:
    """Create the request (and its expiry); the caller shows the turn's requests together."""
    assert call.args is not None
    request = rt.approvals.create(
        approval_id=approval_id_for(run, call, position),
        run_id=run.id,
        call_id=call.id,
        tool=call.name,
        args=call.args,
        requester=run.requester.user_id,
        team_id=run.requester.team_id,
        channel_id=run.requester.channel_id,
        policy_version=rt.policy.version,
        ttl=rt.settings.approval_ttl,
    )
    call.approval_id = request.id
    rt.queue.enqueue_in(
        timedelta(seconds=rt.settings.approval_ttl),
        "worker.jobs.expire_approval",
        request.id,
        job_id=rt.expiry_job_id(request.id),
    )
    rt.events.append(
        run.id,
        EventKind.APPROVAL_REQUESTED,
        approval_id=request.id,
        call_id=call.id,
        tool=call.name,
        args=call.args,
        approvers=rt.policy.approvers_text(call.name),
        expires_at=request.expires_at,
    )
    tool = rt.registry.get(call.name)
    assert tool is not None
    return request, tool


def approval_id_for(run: Run, call: Call, position: int) -> str:
    """The same proposal always maps to the same request, so a worker that stops between
    asking and saving asks again for the same request, not a second one. A proposal is the
    call's place in the run (step, position in the turn), not only its id: some servers
    number calls per turn (`call_0` every time), and a later proposal must never find an
    earlier, already decided request."""
    key = f"{run.id}:{run.usage.steps}:{position}:{call.id}"
    return "ap_" + hashlib.sha256(key.encode()).hexdigest()[:20]


def resolve_turn(rt: Runtime, run: Run) -> Step:
    """Ask for the turn's writes (together: one card for several); collect decided ones;
    suspend while any is undecided."""
    asked: list[tuple[ApprovalRequest, Tool]] = []
    covered: list[ApprovalRequest] = []
    for position, call in enumerate(run.turn):
        if call.state == "done":
            continue
        if call.approval_id is None:
            granted = standing.cover(rt, run, call, approval_id_for(run, call, position))
            if granted is None:
                asking = request_approval(rt, run, call, position)
                if asking[0].status == ApprovalStatus.PENDING:
                    asked.append(asking)
                    continue
                # Asked before, by a worker that stopped before saving, and decided since
                # (the card was out): go on with the decision. Waiting for it again left the
                # run suspended for good, as nothing wakes a decided request (found by the soak).
            else:
                call.approval_id = granted.id
                covered.append(granted)
        assert call.approval_id is not None  # asked (request_approval sets it), or granted
        request = rt.approvals.get(call.approval_id)
        if request.status == ApprovalStatus.PENDING:
            continue
        # The ledger keeps the outcome, so a crash after this line replays it instead of re-running.
        call.result = executor.run_decided(rt, run, call, request)
        call.state = "done"
        if request.status == ApprovalStatus.APPROVED:  # the world may have changed
            run.seen.clear()
            run.repeated.clear()
    rt.surface(run).approvals_covered(run, covered)
    # A request with a card out was asked by a worker that stopped before saving: its card
    # (and its reminders) stand; posted again, it was a second card for the same request.
    asked = [(request, tool) for request, tool in asked if not request.cards]
    if asked:
        rt.surface(run).approvals_requested(run, asked)
        reminders.schedule(rt, [request for request, _ in asked])  # once the cards exist
    if any(c.state == "pending" for c in run.turn):
        rt.surface(run).progress(run, "Waiting for approval")
        return Suspend()
    for call in run.turn:
        run.messages.append({"role": "tool", "tool_call_id": call.id, "content": call.result or ""})
    run.turn = []
    return Continue()


def end(rt: Runtime, run: Run, finish: Finish, lease_token: str) -> None:
    run.status, run.reason, run.detail = finish.status, finish.reason, finish.detail
    run.ended_at = time.time()
    for approval_id in run.pending_approvals:  # the surfaces see why they were withdrawn
        decision = rt.withdraw(approval_id, finish.detail or "the run ended")
        if decision.won:
            rt.surface(run).approval_resolved(run, decision.request)
    if run.answer and run.notes:
        run.answer += "\n\n" + "\n".join(f"_Note: {note}_" for note in run.notes)
    rt.events.append(
        run.id,
        EventKind.ended(finish.status),
        reason=finish.reason.value if finish.reason else None,
        detail=finish.detail,
        answer=(run.answer or "")[:4000],
        steps=run.usage.steps,
        tokens=run.usage.tokens,
        cost=run.usage.cost,
        seconds=run.usage.active_seconds,
    )
    admitted = rt.save_releasing(run, lease_token)
    tracing.run_ended(run)
    metrics.run_ended(run.status, run.usage.active_seconds)
    log.info("run_ended", run_id=run.id, status=finish.status.value, reason=finish.reason)
    say_ended(rt, run, admitted)


def say_ended(rt: Runtime, run: Run, admitted: list[str] | None = None) -> None:
    """After the run was saved as ended: its place in flight is given back (by that save,
    which `admitted` who waited in line) and the person is told. Again by a worker that finds
    the run ended and not yet said (worker/jobs.py, `RunStore.claim_untold`): the one that
    ended it stopped in between, lost the answer of the save, or its surface could not tell
    the person then (`TellLater`)."""
    admit(rt, run, admitted)
    rt.surface(run).finished(run)


def admit(rt: Runtime, run: Run, admitted: list[str] | None) -> None:
    """`run` no longer counts as in flight for its requester: queue the runs admitted from
    their line in its place (`admitted`, each marked due by the save that gave the place
    back), or give the place back first (None: a late teller's). Redis failing here for now
    does not stop the run from being said: interrupted here, it was ended in Redis and never
    said (a worker that takes it again finds it ended). A run admitted is due, so the sweeper
    queues it; a place not given back counts until it goes stale, and the sweeper then
    admits who waits."""
    try:
        if admitted is None:
            admitted = rt.limits.release(run.requester.user_id, run.id, rt.store.keys.due)
        for run_id in admitted:
            rt.enqueue_advance(run_id)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("run_admission_later", run_id=run.id, error=str(exc))
