"""How the runtime reports to people. `bot/` implements it for Slack; the console reads events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import redis
import structlog

from approvals import ApprovalRequest
from tools.registry import Tool
from worker.run import Run
from worker.streaming import TextSink

log = structlog.get_logger(__name__)


class TellLater(Exception):
    """Raised by a surface's `finished` when it cannot tell the person the run ended for now
    (Slack limiting the bot's rate, down, out of reach), not for good: the run stays due and
    marked as not yet said, and a worker tells them again later (worker/jobs.py)."""


class Surface(Protocol):
    """Called by the worker holding the run's lease. A surface may record where it showed
    things in `run.origin` (saved with the run). Exceptions are logged and never end a run."""

    def progress(self, run: Run, text: str) -> None: ...

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None: ...

    def approvals_requested(
        self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]
    ) -> None: ...

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None: ...

    def approvals_covered(self, run: Run, requests: list[ApprovalRequest]) -> None:
        """Writes of one turn that standing grants approved (no card): one compact note."""
        ...

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None: ...

    def answer_stream(self, run: Run) -> TextSink | None:
        """Where the model's answer text goes while it writes it; None: shown at the end."""
        ...

    def finished(self, run: Run) -> None:
        """The run ended: tell the person. `TellLater` when it cannot for now."""
        ...

    def connect_needed(
        self, run: Run, provider: str, label: str, more_access: tuple[str, ...] = ()
    ) -> None:
        """A per-user tool found the requester not connected to `provider`: offer them a
        Connect button (only them). `more_access`: they are connected, but the service asked
        for these scopes too (the Connect button asks for them: connect again)."""
        ...


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

    def approvals_covered(self, run: Run, requests: list[ApprovalRequest]) -> None:
        return None

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        return None

    def answer_stream(self, run: Run) -> TextSink | None:
        return None

    def finished(self, run: Run) -> None:
        return None

    def connect_needed(
        self, run: Run, provider: str, label: str, more_access: tuple[str, ...] = ()
    ) -> None:
        return None


class Guarded:
    """A surface whose failures are logged and swallowed: Slack being down must not end a
    run. The one guard around every call the runtime makes of a surface."""

    def __init__(self, inner: Surface) -> None:
        self.inner = inner

    def progress(self, run: Run, text: str) -> None:
        self._guard("progress", run, lambda: self.inner.progress(run, text))

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        self._guard(
            "approval_requested", run, lambda: self.inner.approval_requested(run, request, tool)
        )

    def approvals_requested(self, run: Run, requests: list[tuple[ApprovalRequest, Tool]]) -> None:
        """The writes one turn asked for, together (one alone as itself)."""
        if len(requests) == 1:
            self.approval_requested(run, *requests[0])
        elif requests:
            self._guard(
                "approvals_requested", run, lambda: self.inner.approvals_requested(run, requests)
            )

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        self._guard("approval_resolved", run, lambda: self.inner.approval_resolved(run, request))

    def approvals_covered(self, run: Run, requests: list[ApprovalRequest]) -> None:
        if requests:
            self._guard(
                "approvals_covered", run, lambda: self.inner.approvals_covered(run, requests)
            )

    def approval_reminders(
        self, run: Run, requests: list[ApprovalRequest], *, escalated: bool
    ) -> None:
        """The requests of one card, together: one DM per person, not one per request."""
        self._guard(
            "approval_reminders",
            run,
            lambda: self.inner.approval_reminders(run, requests, escalated=escalated),
        )

    def connect_needed(
        self, run: Run, provider: str, label: str, more_access: tuple[str, ...] = ()
    ) -> None:
        self._guard(
            "connect_needed",
            run,
            lambda: self.inner.connect_needed(run, provider, label, more_access),
        )

    def answer_stream(self, run: Run) -> TextSink | None:
        try:
            sink = self.inner.answer_stream(run)
        except Exception:  # no stream is better than no answer
            log.exception("surface_failed", method="answer_stream", run_id=run.id)
            return None
        return GuardedSink(sink, run.id) if sink is not None else None

    def finished(self, run: Run) -> None:
        """As the others, but for `TellLater` and Redis failing for now (what the surface
        reads of the run there): the person is told again later, not taken as told."""
        later = (TellLater, redis.ConnectionError, redis.TimeoutError)
        self._guard("finished", run, lambda: self.inner.finished(run), passes=later)

    def _guard(
        self,
        method: str,
        run: Run,
        call: Callable[[], None],
        passes: tuple[type[Exception], ...] = (),
    ) -> None:
        """`call()`, its failures logged and swallowed, but for those it `passes` on."""
        try:
            call()
        except passes:
            raise
        except Exception:  # a process boundary of sorts: the surface is someone else's system
            log.exception("surface_failed", method=method, run_id=run.id)


class GuardedSink:
    """A sink whose failures are logged and swallowed: the surface must never fail a model
    call."""

    def __init__(self, inner: TextSink, run_id: str) -> None:
        self.inner, self.run_id = inner, run_id

    def text(self, delta: str) -> None:
        try:
            self.inner.text(delta)
        except Exception:  # a boundary: the surface is someone else's system
            log.exception("answer_stream_failed", run_id=self.run_id, step="text")

    def reset(self) -> None:
        try:
            self.inner.reset()
        except Exception:  # a boundary, as above
            log.exception("answer_stream_failed", run_id=self.run_id, step="reset")
