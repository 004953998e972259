"""Runs: find and inspect one, list recent ones, cancel, today's spend, and what happens to
a workspace's runs when the app is uninstalled from it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog

from worker import audit, tracing
from worker.access import Access
from worker.audit import Found, RunFilter
from worker.events import Event, EventKind
from worker.run import Run, RunStatus
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

IN_FLIGHT = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL)
SCAN = 10_000  # in-flight runs and pending approvals looked at when a workspace goes
SPEND_SCAN = 5000  # runs created in a day that the spend figure looks at, at most


def find(rt: Runtime, run_id: str) -> Run | None:
    return rt.store.find(run_id)


def recent(
    rt: Runtime, *, user_id: str | None = None, status: RunStatus | None = None, limit: int = 20
) -> list[Run]:
    """Newest first. The caller decides whose runs this person may list (Access)."""
    return rt.store.recent(user_id=user_id, status=status, limit=limit)


def cancelled_by(rt: Runtime, run_id: str) -> str | None:
    """Who asked to cancel the run, if anyone."""
    return rt.store.cancel_requested_by(run_id)


@dataclass(frozen=True)
class TraceRef:
    trace_id: str  # the run's OpenTelemetry trace (worker/tracing.py)
    url: str  # where it is shown (SWITCHBOARD_TRACE_URL); "" when none is configured


@dataclass(frozen=True)
class Inspection:
    run: Run
    events: list[Event]
    cancelled_by: str | None
    trace: TraceRef | None = None  # None: the run was created with traces off


def inspect(rt: Runtime, run: Run) -> Inspection:
    """A run's whole trajectory. The caller checked `Access.may_inspect`."""
    return Inspection(
        run, rt.events.read(run.id), rt.store.cancel_requested_by(run.id), trace_of(rt, run)
    )


def trace_of(rt: Runtime, run: Run) -> TraceRef | None:
    found = tracing.trace_id(run.trace)
    if not found:
        return None
    template = rt.settings.trace_url
    return TraceRef(found, template.replace("{trace_id}", found) if template else "")


@dataclass(frozen=True)
class Spend:
    cost: float
    runs: int
    tokens: int


def spend_since(rt: Runtime, since: float) -> Spend:
    """Cost, runs and tokens of the runs created since `since` (SPEND_SCAN runs at most)."""
    runs = rt.store.created_since(since, limit=SPEND_SCAN)
    return Spend(sum(r.usage.cost for r in runs), len(runs), sum(r.usage.tokens for r in runs))


class CancelResult(StrEnum):
    CANCELLING = "cancelling"
    NOT_ALLOWED = "not_allowed"
    ALREADY_ENDED = "already_ended"
    NOT_FOUND = "not_found"


def cancel(rt: Runtime, run_id: str, *, by: str, roles: frozenset[str]) -> CancelResult:
    """The requester or an admin may cancel; the run ends `partial` at its next step."""
    run = rt.store.find(run_id)
    if run is None:
        return CancelResult.NOT_FOUND
    if not Access.of(rt).may_cancel(run, by, roles):
        return CancelResult.NOT_ALLOWED
    return request_cancel(rt, run, by=by)


def request_cancel(rt: Runtime, run: Run, *, by: str) -> CancelResult:
    """Cancel without a permission check, for a surface acting on its own authority (the
    app was uninstalled from the run's workspace); `by` is recorded as who asked."""
    if run.status.terminal:
        return CancelResult.ALREADY_ENDED
    rt.store.request_cancel(run.id, by)
    rt.events.append(run.id, EventKind.CANCEL_REQUESTED, by=by)
    rt.enqueue_advance(run.id)
    return CancelResult.CANCELLING


@dataclass(frozen=True)
class Ended:
    runs: int  # runs in flight that were asked to cancel
    approvals: int  # pending approvals withdrawn


def end_workspace(rt: Runtime, surface: str, team: str, *, why: str, withdrawn: str) -> Ended:
    """A workspace is gone (the app uninstalled, its token revoked): cancel its runs in
    flight from `surface` and withdraw their pending approvals (`withdrawn`: the reason the
    cards show), so nothing waits on people who can no longer see it. Runs recorded without
    a team count as this one's."""
    runs = [
        run
        for status in IN_FLIGHT
        for run in rt.store.recent(status=status, limit=SCAN)
        if run.origin.get("surface") == surface and run.origin.get("team", "") in ("", team)
    ]
    for run in runs:
        request_cancel(rt, run, by=why)
    ours = {run.id for run in runs}
    count = 0
    for request in rt.approvals.pending(limit=SCAN):
        if request.run_id in ours and rt.withdraw(request.id, withdrawn).won:
            count += 1
    return Ended(runs=len(runs), approvals=count)


def events(rt: Runtime, run_id: str, after: str = "0") -> list[Event]:
    """The run's events after id `after` ("0": from the first), oldest first."""
    return rt.events.read(run_id, after)


def wait_for_events(rt: Runtime, run_id: str, after: str, block_ms: int) -> list[Event]:
    """Events after `after`, waiting up to `block_ms` for the first one (to follow a run)."""
    return rt.events.wait(run_id, after, block_ms)


def events_so_far(rt: Runtime, run_id: str) -> str:
    """The id of the run's last event now: follow the run from there."""
    return str(rt.redis.llen(rt.events.keys.events(run_id)))


def search(rt: Runtime, where: RunFilter, *, limit: int) -> Found:
    """Runs matching `where`, newest first (worker.audit: bounded reads)."""
    return audit.find_runs(rt.store, where, limit=limit)


def export(rt: Runtime, since: float, until: float | None) -> Iterator[dict[str, Any]]:
    """Every run created in the range, oldest first, with its whole trajectory."""
    return audit.export_runs(rt.store, rt.events, since, until)


def skipped_unknown(rt: Runtime) -> int:
    """Runs of a schema version this release cannot read, left out of listings so far."""
    return rt.store.skipped_unknown
