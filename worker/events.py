"""A run's append-only event log: who did what, when (a Redis list `{ns}run:{id}:events`).

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

import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
import structlog

from worker.keys import Keys
from worker.run import RunStatus

log = structlog.get_logger(__name__)

MAX_EVENTS_PER_RUN = 5000  # a run is bounded by its budgets; this only stops a runaway log
POLL_SECONDS = 0.05


class EventKind(StrEnum):
    """What happened, as the log records it (the value is what is stored)."""

    # worker/service.py
    RUN_CREATED = "run_created"
    WAITING_IN_LINE = "waiting_in_line"
    DECISION_REFUSED = "decision_refused"  # also bot/listeners.py
    APPROVAL_DECIDED = "approval_decided"
    CANCEL_REQUESTED = "cancel_requested"
    # worker/loop.py
    HANDED_BACK = "handed_back"
    SUSPENDED = "suspended"
    ROLES_UNAVAILABLE = "roles_unavailable"
    ROLES_CHANGED = "roles_changed"
    POLICY_CHANGED = "policy_changed"  # the policy file was reloaded while the run was open
    MODEL_ERROR = "model_error"
    UNGROUNDED_NUMBERS = "ungrounded_numbers"
    DEMOS_SELECTED = "demos_selected"
    MODEL_CALL = "model_call"
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
    # bot/demos.py, bot/edit.py
    DEMO_CANDIDATE_SAVED = "demo_candidate_saved"
    EDIT_REFUSED = "edit_refused"

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
    }
)


@dataclass(frozen=True)
class Event:
    id: str
    at: float
    kind: str
    data: dict[str, Any]


class EventLog:
    def __init__(self, connection: redis.Redis, namespace: str = "sb:") -> None:
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        # run id -> events not written yet, while this process holds the run. One thread works
        # a run at a time, and each touches only its own run's list.
        self._held: dict[str, list[str]] = {}

    def append(self, run_id: str, kind: EventKind, **data: Any) -> None:
        body = json.dumps({"k": kind, "at": round(time.time(), 3), **data}, default=str)
        held = self._held.get(run_id)
        if held is not None:
            held.append(body)
        else:
            self._push(run_id, [body])

    def hold(self, run_id: str) -> None:
        """Keep this run's events until `take` or `flush` (the caller holds its lease)."""
        self._held[run_id] = []

    def take(self, run_id: str) -> list[str]:
        """The run's kept events, for the caller to write (with a save)."""
        held = self._held.get(run_id)
        if not held:
            return []
        self._held[run_id] = []
        return held

    def flush(self, run_id: str) -> None:
        """Write the run's kept events now."""
        events = self.take(run_id)
        if events:
            self._push(run_id, events)

    def release(self, run_id: str) -> None:
        """Write what is left and stop keeping."""
        self.flush(run_id)
        self._held.pop(run_id, None)

    def _push(self, run_id: str, bodies: list[str]) -> None:
        length = int(self.redis.rpush(self.keys.events(run_id), *bodies))
        if length > MAX_EVENTS_PER_RUN:
            self.redis.ltrim(self.keys.events(run_id), 0, MAX_EVENTS_PER_RUN - 1)
            log.warning("event_log_full", run_id=run_id)

    def read(self, run_id: str, after: str = "0", count: int | None = None) -> list[Event]:
        """Events after id `after` ("0" or "-": from the first), oldest first."""
        start = 0 if after in ("-", "") else int(after)
        stop = -1 if count is None else start + count - 1
        rows = self.redis.lrange(self.keys.events(run_id), start, stop)
        return [_decode(str(start + n + 1), raw) for n, raw in enumerate(rows)]

    def read_all(self, run_ids: list[str]) -> list[list[Event]]:
        """The whole log of each run, in one round trip (an export reads runs by the page)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.lrange(self.keys.events(run_id), 0, -1)
        return [[_decode(str(n + 1), raw) for n, raw in enumerate(rows)] for rows in pipe.execute()]

    def wait(self, run_id: str, after: str, block_ms: int) -> list[Event]:
        """Events after `after`, waiting up to `block_ms` for the first one."""
        deadline = time.monotonic() + block_ms / 1000
        while True:
            events = self.read(run_id, after)
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(POLL_SECONDS)


def _decode(event_id: str, raw: bytes) -> Event:
    body = json.loads(raw)
    kind = body.pop("k")
    at = body.pop("at")
    return Event(id=event_id, at=at, kind=kind, data=body)
