"""How the runtime reports to people. `bot/` implements it for Slack; the console reads events."""

from __future__ import annotations

from typing import Protocol

import structlog

from approvals import ApprovalRequest
from tools.registry import Tool
from worker.run import Run

log = structlog.get_logger(__name__)


class Surface(Protocol):
    """Called by the worker holding the run's lease. A surface may record where it showed
    things in `run.origin` (saved with the run). Exceptions are logged and never end a run."""

    def progress(self, run: Run, text: str) -> None: ...

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None: ...

    def approvals_requested(
        self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]
    ) -> None: ...

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None: ...

    def approval_reminder(self, run: Run, request: ApprovalRequest, *, escalated: bool) -> None: ...

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None: ...

    def finished(self, run: Run) -> None: ...


class SilentSurface:
    """For runs whose surface reads the event stream instead (the terminal console, tests)."""

    def progress(self, run: Run, text: str) -> None:
        return None

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        return None

    def approvals_requested(self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]) -> None:
        return None

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        return None

    def approval_reminder(self, run: Run, request: ApprovalRequest, *, escalated: bool) -> None:
        return None

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        return None

    def finished(self, run: Run) -> None:
        return None


class Guarded:
    """A surface whose failures are logged and swallowed: Slack being down must not end a run."""

    def __init__(self, inner: Surface) -> None:
        self.inner = inner

    def progress(self, run: Run, text: str) -> None:
        self._call("progress", run, text)

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        self._call("approval_requested", run, request, tool)

    def approvals_requested(self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]) -> None:
        """The writes one turn asked for, together; a surface that cannot show them as one
        shows each on its own."""
        if len(requests) > 1 and hasattr(self.inner, "approvals_requested"):
            self._call("approvals_requested", run, requests)
            return
        for request, tool in requests:
            self._call("approval_requested", run, request, tool)

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        self._call("approval_resolved", run, request)

    def approval_reminder(self, run: Run, request: ApprovalRequest, *, escalated: bool) -> None:
        self.approval_reminders(run, [request], escalated=escalated)

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        """The requests of one card, together (one DM per person, not one per request); a
        surface that can only remind of one request is told of each."""
        try:
            if hasattr(self.inner, "approval_reminders"):
                self.inner.approval_reminders(run, requests, escalated=escalated)
            elif hasattr(self.inner, "approval_reminder"):  # a surface may have no way to remind
                for request in requests:
                    self.inner.approval_reminder(run, request, escalated=escalated)
        except Exception:  # as _call: the surface is someone else's system
            log.exception("surface_failed", method="approval_reminders", run_id=run.id)

    def finished(self, run: Run) -> None:
        self._call("finished", run)

    def _call(self, method: str, run: Run, *args: object) -> None:
        try:
            getattr(self.inner, method)(run, *args)
        except Exception:  # a process boundary of sorts: the surface is someone else's system
            log.exception("surface_failed", method=method, run_id=run.id)
