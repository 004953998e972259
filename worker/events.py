"""A run's append-only event stream: who did what, when (Redis stream `{ns}run:{id}:events`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

MAX_EVENTS_PER_RUN = 5000  # a run is bounded by its budgets; this only stops a runaway stream


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

    def key(self, run_id: str) -> str:
        return f"{self.ns}run:{run_id}:events"

    def append(self, run_id: str, kind: str, **data: Any) -> str:
        body = json.dumps({"k": kind, "at": round(time.time(), 3), **data}, default=str)
        event_id = self.redis.xadd(
            self.key(run_id), {"e": body}, maxlen=MAX_EVENTS_PER_RUN, approximate=True
        )
        return event_id.decode() if isinstance(event_id, bytes) else str(event_id)

    def read(self, run_id: str, after: str = "-", count: int | None = None) -> list[Event]:
        start = "-" if after == "-" else f"({after}"
        rows = self.redis.xrange(self.key(run_id), min=start, count=count)
        return [_decode(entry_id, fields) for entry_id, fields in rows]

    def wait(self, run_id: str, after: str, block_ms: int) -> list[Event]:
        """Events after `after` ("0" for all), blocking up to `block_ms` for the first one."""
        reply = self.redis.xread({self.key(run_id): after}, block=block_ms)
        return [_decode(entry_id, fields) for _key, rows in reply for entry_id, fields in rows]


def _decode(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Event:
    body = json.loads(fields[b"e"])
    kind = body.pop("k")
    at = body.pop("at")
    event_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return Event(id=event_id, at=at, kind=kind, data=body)
