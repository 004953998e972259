"""How the runtime reports to people. `bot/` implements it for Slack; the console reads events."""

from __future__ import annotations

from typing import Protocol

from approvals import ApprovalRequest
from tools import Tool
from worker.run import Run


class Surface(Protocol):
    """Called by the worker holding the run's lease. A surface may record where it showed
    things in `run.origin` (saved with the run). Exceptions are logged and never end a run."""

    def progress(self, run: Run, text: str) -> None: ...

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None: ...

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None: ...

    def finished(self, run: Run) -> None: ...


class SilentSurface:
    """For runs whose surface reads the event stream instead (the terminal console, tests)."""

    def progress(self, run: Run, text: str) -> None:
        return None

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        return None

    def approval_resolved(self, run: Run, request: ApprovalRequest) -> None:
        return None

    def finished(self, run: Run) -> None:
        return None
