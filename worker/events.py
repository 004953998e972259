"""What a run's event log holds: its kinds (`EventKind`) and entries (`Event`). The log
itself, a Redis list `{ns}run:{id}:events`, is `worker.eventlog.EventLog`.

A list, not a stream: Redis preallocates 4 KB for every stream, which would be half of what a
suspended run may cost; a short list of JSON entries costs what it holds. An event's id is its
position (1, 2, …), so readers resume after the last id they saw.

While a worker holds a run, its events are kept and written with the step's save, in the same
script (`RunStore.save`): one round trip per step instead of one per event, and the log never
shows a step the run document does not. `flush` writes them at once where the record must come
first (an approved write about to start).

Every kind of event any code writes is an `EventKind`; the log stores its string value, so
runs written before the enum existed read the same. Readers keep `Event.kind` a plain string:
a log may hold kinds from an older or newer version, and those must still show.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from worker.run import RunStatus


class EventKind(StrEnum):
    """What happened, as the log records it (the value is what is stored)."""

    # worker/service/ (asking, decisions, runs)
    RUN_CREATED = "run_created"
    CONNECTION_NEEDED = "connection_needed"  # a per-user tool: the person must connect
    WAITING_IN_LINE = "waiting_in_line"
    DECISION_REFUSED = "decision_refused"
    APPROVAL_DECIDED = "approval_decided"
    CANCEL_REQUESTED = "cancel_requested"
    # worker/loop.py
    HANDED_BACK = "handed_back"
    SUSPENDED = "suspended"
    ROLES_UNAVAILABLE = "roles_unavailable"
    ROLES_CHANGED = "roles_changed"
    POLICY_CHANGED = "policy_changed"  # the policy file was reloaded while the run was open
    MODEL_ERROR = "model_error"
    UNGROUNDED_FACTS = "ungrounded_facts"  # the answer states facts no source has
    UNGROUNDED_NUMBERS = "ungrounded_numbers"  # its older form (numbers only), in older logs
    DEMOS_SELECTED = "demos_selected"
    MODEL_CALL = "model_call"
    # worker/model_watch.py, written as they happen (not with the step's save)
    MODEL_CALL_STARTED = "model_call_started"
    MODEL_ATTEMPT_FAILED = "model_attempt_failed"
    TOOL_INVALID = "tool_invalid"
    REPEATED_CALL = "repeated_call"
    TOOL_DENIED = "tool_denied"
    APPROVAL_REQUESTED = "approval_requested"
    # worker/loop.py, "run_" + the run's final status: see `ended`
    RUN_COMPLETED = "run_completed"
    RUN_PARTIAL = "run_partial"
    RUN_FAILED = "run_failed"
    # worker/executor.py
    WRITE_STARTED = "write_started"
    WRITE_RECONCILED = "write_reconciled"
    WRITE_UNKNOWN = "write_unknown"
    TOOL_RESULT = "tool_result"
    # worker/jobs.py, worker/reminders.py
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_REMINDED = "approval_reminded"
    APPROVAL_ESCALATED = "approval_escalated"
    # worker/service/library.py, worker/service/decisions.py
    DEMO_CANDIDATE_SAVED = "demo_candidate_saved"
    EDIT_REFUSED = "edit_refused"
    # worker/service/grants.py, worker/standing.py: standing grants
    GRANT_CREATED = "grant_created"
    GRANT_REVOKED = "grant_revoked"
    APPROVAL_COVERED = "approval_covered"  # a write approved by a grant, without a card

    @classmethod
    def ended(cls, status: RunStatus) -> EventKind:
        """The kind that records a run ending with `status` (a final one)."""
        return cls(f"run_{status.value}")


def is_run_end(kind: str) -> bool:
    """Whether an event of `kind` records the end of its run. By prefix, so an ending that
    another version writes (say run_cancelled) is one too."""
    return kind.startswith("run_") and kind != EventKind.RUN_CREATED


# Kinds no surface renders in its own words: each shows them by name (Slack's run view) or by
# name with their data (`switchboard runs show`). Every other kind has a renderer on both.
GENERIC_KINDS: frozenset[EventKind] = frozenset(
    {
        EventKind.WAITING_IN_LINE,
        EventKind.HANDED_BACK,
        EventKind.ROLES_UNAVAILABLE,
        EventKind.ROLES_CHANGED,
        EventKind.POLICY_CHANGED,
        EventKind.MODEL_ERROR,
        EventKind.REPEATED_CALL,
        EventKind.APPROVAL_REMINDED,
        EventKind.APPROVAL_ESCALATED,
        EventKind.EDIT_REFUSED,
        EventKind.GRANT_REVOKED,
    }
)


@dataclass(frozen=True)
class Event:
    id: str
    at: float
    kind: str
    data: dict[str, Any]
