"""Writes suspend the run for a person; decisions are checked, atomic, and run a write once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from rq.registry import StartedJobRegistry

from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, make_runtime, requester, tool_messages, wait_until, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import EndReason, RunStatus
from worker.service import DecisionResult
from worker.surface import Surface
from worker.sweeper import Sweeper

CREATE = Turn(
    tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down", "body": "since 9am"})]
)

POLICY = """\
roles:
  admins: [UADMIN]
  support: [USUPPORT, USUPPORT2]
admins: [admins]
tools:
  create_ticket:
    allow: [everyone]
    approvers: [support]
    self_approval: false
# grant the tools this file does not name, as when there is no policy file
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""


def _policy(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def _suspended(rt, model_server, question="file a ticket: VPN is down"):
    run = service.submit(rt, question, ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL, run.detail
    return run


def test_a_write_suspends_with_no_job_held(redis_conn, model_server, tickets_db, tmp_path):
    model_server.route("VPN", [CREATE, "Ticket filed."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=_policy(tmp_path))
    run = _suspended(rt, model_server)

    [approval_id] = run.pending_approvals
    request = rt.approvals.get(approval_id)
    assert request.tool == "create_ticket" and request.requester == "UALICE"
    assert (
        request.args
        == {"project": "IT", "title": "VPN is down", "body": "since 9am", "priority": "normal"}
        or request.args["title"] == "VPN is down"
    )
    assert rt.queue.count == 0
    assert StartedJobRegistry(queue=rt.queue).count == 0
    assert not redis_conn.exists(rt.store.keys.lease(run.id))
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_only_allowed_people_decide_and_fifty_approvals_run_it_once(
    redis_conn, model_server, tickets_db, tmp_path
):
    model_server.route("VPN", [CREATE, "Ticket filed."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=_policy(tmp_path))
    run = _suspended(rt, model_server)
    [approval_id] = run.pending_approvals

    # the requester may not approve their own call here; nor may a stranger
    for user in ("UALICE", "USTRANGER"):
        who = requester(rt, user)
        outcome = service.decide(
            rt, approval_id, decider_id=user, decider_roles=frozenset(who.roles), approve=True
        )
        assert outcome.result == DecisionResult.NOT_ALLOWED
        assert "support" in outcome.approvers
    assert rt.approvals.get(approval_id).status == "pending"

    def approve(n: int):
        user = "USUPPORT" if n % 2 else "USUPPORT2"
        return service.decide(
            rt,
            approval_id,
            decider_id=user,
            decider_roles=rt.policy.roles_for(user),
            approve=True,
        )

    with ThreadPoolExecutor(max_workers=50) as pool:
        outcomes = list(pool.map(approve, range(50)))
    results = [o.result for o in outcomes]
    assert results.count(DecisionResult.DECIDED) == 1
    assert results.count(DecisionResult.ALREADY_DECIDED) == 49
    winner = next(o.request for o in outcomes if o.result == DecisionResult.DECIDED)
    assert all(o.request.decided_by == winner.decided_by for o in outcomes)

    assert rt.queue.fetch_job(rt.expiry_job_id(approval_id)) is None  # no expiry job left behind
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
    decided = [e for e in rt.events.read(run.id) if e.kind == "approval_decided"]
    assert len(decided) == 1 and decided[0].data["by"] == winner.decided_by


def test_rejection_reaches_the_model_with_the_reason(
    redis_conn, model_server, tickets_db, tmp_path
):
    model_server.route("VPN", [CREATE, "OK, I did not file it."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=_policy(tmp_path))
    run = _suspended(rt, model_server)
    outcome = service.decide(
        rt,
        run.pending_approvals[0],
        decider_id="USUPPORT",
        decider_roles=rt.policy.roles_for("USUPPORT"),
        approve=False,
        reason="duplicate of INC-7",
    )
    assert outcome.result == DecisionResult.DECIDED
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    [observation] = tool_messages(model_server.last_chat_request)
    assert "rejected" in observation and "USUPPORT" in observation
    assert "duplicate of INC-7" in observation
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_expiry_through_the_rq_scheduler_is_a_denial(redis_conn, model_server, tickets_db):
    model_server.route("VPN", [CREATE, "It expired, so nothing was filed."])
    rt = make_runtime(redis_conn, model_server.url, approval_ttl=0.5)
    run = _suspended(rt, model_server)
    request = rt.approvals.get(run.pending_approvals[0])
    wait_until(lambda: time.time() > request.expires_at + 0.1, what="expiry time")
    scheduler = Sweeper(rt).scheduler  # RQ's scheduler, as every worker's sweeper runs it
    assert scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()
    assert rt.expiry_job_id(request.id) in rt.queue.job_ids
    work(rt)

    run = rt.store.load(run.id)
    assert rt.approvals.get(request.id).status == "expired"
    assert run.status == RunStatus.COMPLETED
    [observation] = tool_messages(model_server.last_chat_request)
    assert "expired" in observation and "Not run" in observation
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0
    # a click after expiry learns it is over
    late = service.decide(
        rt, request.id, decider_id="UALICE", decider_roles=frozenset({"everyone"}), approve=True
    )
    assert late.result == DecisionResult.ALREADY_DECIDED


def test_cancel_withdraws_pending_approvals(redis_conn, model_server, tickets_db):
    model_server.route("VPN", [CREATE, "never"])
    rt = make_runtime(redis_conn, model_server.url)
    run = _suspended(rt, model_server)
    stranger = service.cancel(rt, run.id, by="USTRANGER", roles=frozenset({"everyone"}))
    assert stranger == service.CancelResult.NOT_ALLOWED
    assert service.cancel(rt, run.id, by="UALICE", roles=frozenset()) == "cancelling"
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason.CANCELLED)
    assert rt.approvals.get(run.turn[0].approval_id or "").status == "withdrawn"
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_two_writes_in_one_turn_each_need_a_decision(redis_conn, model_server, tickets_db):
    model_server.route(
        "two tickets",
        [
            Turn(
                tool_calls=[
                    ("create_ticket", {"project": "IT", "title": "one"}),
                    ("create_ticket", {"project": "IT", "title": "two"}),
                ]
            ),
            "Filed one, the other was rejected.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = _suspended(rt, model_server, "two tickets please")
    first, second = run.pending_approvals
    alice = frozenset(ALICE.roles)
    service.decide(rt, first, decider_id="UALICE", decider_roles=alice, approve=True)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL  # still waiting for the second
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
    service.decide(rt, second, decider_id="UALICE", decider_roles=alice, approve=False)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    observed = tool_messages(model_server.last_chat_request)
    assert len(observed) == 2 and "Not run" in observed[1]
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1


class BrokenSurface:
    """A surface whose every call fails, like Slack being down."""

    calls = 0

    def _fail(self, *args: object) -> None:
        BrokenSurface.calls += 1
        raise ConnectionError("slack is down")

    progress = approval_requested = approvals_requested = approval_resolved = _fail
    approval_reminder = answer_stream = finished = _fail


def test_a_failing_surface_never_ends_a_run(redis_conn, model_server, tickets_db):
    model_server.route("VPN", [CREATE, "Ticket filed."])
    rt = make_runtime(
        redis_conn, model_server.url, surfaces={"slack": cast(Surface, BrokenSurface())}
    )
    run = service.submit(rt, "VPN again, file it", ALICE, origin={"surface": "slack"})
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL
    service.decide(
        rt,
        run.pending_approvals[0],
        decider_id="UALICE",
        decider_roles=frozenset(ALICE.roles),
        approve=True,
    )
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert BrokenSurface.calls >= 4


def test_the_sweeper_expires_overdue_approvals_when_no_scheduler_did(
    redis_conn, model_server, tickets_db
):
    from worker.sweeper import sweep

    model_server.route("VPN", [CREATE, "Expired, not filed."])
    rt = make_runtime(redis_conn, model_server.url, approval_ttl=0.3)
    run = _suspended(rt, model_server)
    request = rt.approvals.get(run.pending_approvals[0])
    wait_until(lambda: time.time() > request.expires_at, what="expiry time")
    sweep(rt)
    assert rt.approvals.get(request.id).status == "expired"
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0


def test_a_request_decided_before_the_run_was_saved_is_carried_out_not_waited_for(
    redis_conn, model_server, tickets_db, tmp_path
):
    """The worker that asked posted the card and died before saving; the card was clicked;
    the next worker, from the run as last saved, asks for the same request and finds it
    decided: it runs the write (once) instead of waiting for a decision that was made."""
    model_server.route("VPN", [CREATE, "Ticket filed."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=_policy(tmp_path))
    run = _suspended(rt, model_server)
    [approval_id] = run.pending_approvals
    for call in run.turn:  # Redis holds the run as it was before the ask: the save was lost
        call.approval_id = None
    rt.store.save(run)
    decided = service.decide(
        rt,
        approval_id,
        decider_id="USUPPORT",
        decider_roles=frozenset({"support"}),
        approve=True,
    )
    assert decided.result == DecisionResult.DECIDED
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, (run.status, run.detail)
    assert TicketStore(tickets_db).count_executions("create_ticket") == 1
