"""The trusted context a tool receives: who is asking, where, and for which call."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolContext:
    """Identity and call metadata injected by the controller, never by the model.

    `idempotency_key` is set for writes (the approval id): a write tool uses it
    to make sure its effect happens at most once however often it is retried.
    """

    user_id: str
    team_id: str = ""
    channel_id: str = ""
    roles: frozenset[str] = frozenset()
    run_id: str = ""
    call_id: str = ""
    idempotency_key: str | None = None
