"""The trusted context a tool receives: who is asking, where, and for which call."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tools.exceptions import ToolError

MIN_CALL_SECONDS = 1.0  # a call started near the run's deadline still gets this long


@dataclass(frozen=True)
class ToolContext:
    """Identity and call metadata injected by the controller, never by the model.

    `idempotency_key` is set for writes (the approval id): a write tool uses it
    to make sure its effect happens at most once however often it is retried.
    `deadline` is when the run's time is up, as a `time.monotonic()` value of
    this process (None: no deadline); `execute` cuts the tool's timeout to it.
    `settings` are the operator's settings for tools, by name, from the composition root
    (the built-in samples read `knowledge` and `tickets_db`, their data files, set with
    SWITCHBOARD_KNOWLEDGE and SWITCHBOARD_TICKETS_DB): a tool reads its configuration here,
    not from the environment.
    `credentials` is for per-user tools (declared with `connection=`): `access_token()`
    returns the asking person's own token, refreshed when needed; `access_token_refused()`
    is what a tool says when the service refused that token (`refused` does it).
    """

    user_id: str
    team_id: str = ""
    channel_id: str = ""
    roles: frozenset[str] = frozenset()
    run_id: str = ""
    call_id: str = ""
    idempotency_key: str | None = None
    deadline: float | None = None
    settings: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The requester's own token for the tool's connection, asked for when the tool calls
    # `access_token()` (set by the controller for per-user tools only).
    credentials: Callable[[], str] | None = field(default=None, hash=False, repr=False)
    refused: Callable[[str, bool], str] | None = field(default=None, hash=False, repr=False)

    def access_token(self) -> str:
        """The OAuth access token of the person asking, for this tool's connection: never
        the operator's, never an approver's. Raises NotConnected (the model is told the
        person must connect) when they have not."""
        if self.credentials is None:
            raise ToolError(
                "Error: this tool was declared without `connection=`, so it has no person's "
                "token to act with"
            )
        return self.credentials()

    def access_token_refused(self, token: str, *, refresh: bool = True) -> str:
        """The service refused `token` (HTTP 401) though it had not expired as far as we
        knew: it is no longer good. With `refresh`, the connection is refreshed and the new
        token returned; without (the refreshed one was refused too), or when the provider
        refuses the refresh, the connection is dropped and NotConnected raised, so the
        person is asked to connect again."""
        if self.refused is None:
            raise ToolError("Error: the service refused this tool's credentials")
        return self.refused(token, refresh)

    def time_left(self, timeout: float) -> float:
        """Seconds this call may take: the tool's `timeout`, cut to the run's deadline, but
        never below MIN_CALL_SECONDS (as the loop does for a model call near the deadline)."""
        if self.deadline is None:
            return timeout
        return min(timeout, max(MIN_CALL_SECONDS, self.deadline - time.monotonic()))
